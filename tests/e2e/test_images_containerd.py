"""Image pulls through the proxy, from the local registry (`registry.py`), against the same calls
made straight to containerd.

PullImage is the CRI call that waits longest on a node (the whole image comes in before it answers)
and the one whose failure a kubelet reports to the user as it reads (ErrImagePull): through the
proxy it must fetch the same image, answer the same reference and fail with the same status.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import grpc
import pytest
from containerd import CriClient, PrivateContainerd, connect
from registry import Registry

pytestmark = pytest.mark.e2e

SHELL = "registry.k8s.io/e2e-test-images/busybox:1.29-2"
NAMED_USER = "gcr.io/k8s-staging-cri-tools/test-image-user-username:latest"
NOT_SERVED = "gcr.io/k8s-staging-cri-tools/not-served:latest"


def _remove(cri: CriClient, name: str) -> None:
    api = cri.api
    if cri.image.ImageStatus(api.ImageStatusRequest(image=api.ImageSpec(image=name)), timeout=10).HasField(
        "image"
    ):
        cri.image.RemoveImage(api.RemoveImageRequest(image=api.ImageSpec(image=name)), timeout=30)


@pytest.fixture(autouse=True)
def _pulled_images_removed(containerd: PrivateContainerd) -> Iterator[None]:
    """The images pulled here are removed after each test: the other tests see the test bed's
    images alone (`test_ctl_containerd.py` compares `images` listings with crictl's)."""
    yield
    with connect(containerd.address) as cri:
        for name in (SHELL, NAMED_USER):
            _remove(cri, name)


def _pull_error(cri: CriClient, name: str) -> tuple[grpc.StatusCode, str]:
    api = cri.api
    with pytest.raises(grpc.RpcError) as caught:
        cri.image.PullImage(api.PullImageRequest(image=api.ImageSpec(image=name)), timeout=60)
    err = caught.value
    return err.code(), err.details()


def test_a_pull_through_the_proxy_is_containerds_pull(
    via_proxy_and_direct: tuple[CriClient, CriClient], registry: Registry
) -> None:
    through, direct = via_proxy_and_direct
    api = through.api
    for name in (SHELL, NAMED_USER):
        _remove(direct, name)  # so that the pull through the proxy fetches it whole

    asked = len(registry.pulls)
    ref = through.image.PullImage(
        api.PullImageRequest(image=api.ImageSpec(image=SHELL)), timeout=60
    ).image_ref
    fetched = registry.pulls[asked:]
    blobs = registry.manifests[("e2e-test-images/busybox", "1.29-2")]
    assert ref == blobs.image_id, "the reference answered is the id containerd gives the image"
    assert any(f"/blobs/{blobs.image_id}" in line for line in fetched), fetched
    assert any("/e2e-test-images/busybox/manifests/" in line for line in fetched), fetched

    spec = api.ImageStatusRequest(image=api.ImageSpec(image=SHELL))
    seen, straight = through.image.ImageStatus(spec, timeout=10), direct.image.ImageStatus(spec, timeout=10)
    assert seen.image.id == ref and SHELL in seen.image.repo_tags
    assert seen == straight
    listed = {i.id for i in through.image.ListImages(api.ListImagesRequest(), timeout=10).images}
    assert listed == {i.id for i in direct.image.ListImages(api.ListImagesRequest(), timeout=10).images}
    assert ref in listed

    # what the image's config says reaches the client as containerd reads it
    direct_ref = direct.image.PullImage(
        api.PullImageRequest(image=api.ImageSpec(image=NAMED_USER)), timeout=60
    )
    spec = api.ImageStatusRequest(image=api.ImageSpec(image=NAMED_USER))
    status = through.image.ImageStatus(spec, timeout=10).image
    assert (status.id, status.username) == (direct_ref.image_ref, "www-data")

    # removed through the proxy: gone for containerd too
    through.image.RemoveImage(api.RemoveImageRequest(image=api.ImageSpec(image=NAMED_USER)), timeout=30)
    assert not direct.image.ImageStatus(spec, timeout=10).HasField("image")


def test_a_name_the_registry_lacks_fails_as_it_does_directly(
    via_proxy_and_direct: tuple[CriClient, CriClient],
) -> None:
    through, direct = via_proxy_and_direct
    code, details = _pull_error(through, NOT_SERVED)
    assert (code, details) == _pull_error(direct, NOT_SERVED)
    assert code == grpc.StatusCode.NOT_FOUND and NOT_SERVED in details


def test_a_slow_pull_leaves_the_connection_to_other_calls(
    via_proxy_and_direct: tuple[CriClient, CriClient], registry: Registry
) -> None:
    """The registry holds the layer 2 s (a pull that takes its time, as on a node): other calls on
    the same connection are answered meanwhile, and the pull then ends with the image pulled."""
    through, direct = via_proxy_and_direct
    api = through.api
    _remove(direct, SHELL)
    blobs = registry.manifests[("e2e-test-images/busybox", "1.29-2")]
    layer = next(digest for digest in blobs.blobs() if digest not in (blobs.digest, blobs.image_id))
    registry.delays[layer] = 2.0
    asked = len(registry.pulls)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pull = pool.submit(
                through.image.PullImage, api.PullImageRequest(image=api.ImageSpec(image=SHELL)), timeout=60
            )
            while not any(f"/blobs/{layer}" in line for line in registry.pulls[asked:]):  # it waits
                assert not pull.done(), pull.result()
                time.sleep(0.01)
            for _ in range(20):
                version = through.runtime.Version(api.VersionRequest(version=through.version), timeout=10)
                assert version.runtime_name == "containerd"
                listed = through.image.ListImages(api.ListImagesRequest(), timeout=10).images
                assert SHELL not in {tag for image in listed for tag in image.repo_tags}
            assert not pull.done(), "the calls above were answered while the pull waited"
            assert pull.result(timeout=60).image_ref == blobs.image_id
    finally:
        del registry.delays[layer]
    status = direct.image.ImageStatus(api.ImageStatusRequest(image=api.ImageSpec(image=SHELL)), timeout=10)
    assert status.image.id == blobs.image_id
