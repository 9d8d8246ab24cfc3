"""The versions the plugin is built against: the one place they are listed."""

SUPPORTED_SGLANG = ("0.5.23",)
SUPPORTED_NIXL = ("1.5.1",)
# torch/triton as pinned by sglang 0.5.23 (torch==2.14.1 requires triton~=3.8.0)
TESTED_TORCH = ("2.14.1",)
TESTED_TRITON = ("3.8.0",)
# the lent H200's image runs the device scripts with these; the kernels must work there too
DEVICE_TORCH = ("2.11.0",)
DEVICE_TRITON = ("3.6.0",)


def installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
