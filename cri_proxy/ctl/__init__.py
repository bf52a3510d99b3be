"""`cri-proxy ctl`: a crictl-compatible CLI, plus what only the proxy knows.

One small module per job: `options` (crictl's global flags, /etc/crictl.yaml, environment),
`conn` (the CRI channels and one-line errors), `output` (tables, JSON, YAML, ages, sizes),
`resolve` (id prefixes), then the command groups: `runtime`, `pods`, `containers`, `logs`,
`images`, `call` (generic pass-through) and `proxy` (the proxy's own views).
"""
