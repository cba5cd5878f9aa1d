"""Regenerate the Python modules for the etcd v3 protos.

Usage (from the repository root)::

    python -m proto.generate              # rewrite proto/*_pb2*.py[i]
    python -m proto.generate --out DIR    # write them to DIR instead
    python -m proto.generate --check      # exit 1 if the committed files are stale

protoc emits top-level imports between the generated modules
(``import kv_pb2 as kv__pb2``); they are rewritten to package-relative form
(``from proto import kv_pb2 as kv__pb2``) so the code imports as
``proto.kv_pb2``, ``proto.rpc_pb2_grpc`` etc. without touching ``sys.path``.
The output depends only on the .proto sources and the installed grpcio-tools.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PACKAGE = PROTO_DIR.name  # "proto"

# Sources in dependency order, and those that declare services.
PROTO_FILES = ("kv.proto", "auth.proto", "lease.proto", "rpc.proto", "v3lock.proto", "v3election.proto")
SERVICE_FILES = ("rpc.proto", "v3lock.proto", "v3election.proto")

_MODULES = tuple(Path(name).stem + "_pb2" for name in PROTO_FILES)
_IMPORT_RE = re.compile(
    rf"^import ({'|'.join(_MODULES)}) as (\w+)$", flags=re.MULTILINE
)


def generated_files() -> list[str]:
    """Names of the files `generate` writes, sorted."""
    names = []
    for proto in PROTO_FILES:
        stem = Path(proto).stem
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi"]
        if proto in SERVICE_FILES:
            names.append(f"{stem}_pb2_grpc.py")
    return sorted(names)


def _rewrite_imports(source: str) -> str:
    return _IMPORT_RE.sub(rf"from {PACKAGE} import \1 as \2", source)


def _run_protoc(out_dir: Path) -> None:
    # Imported lazily: importing grpc_tools.protoc installs import hooks.
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(PROTO_DIR / name) for name in PROTO_FILES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; see the messages above")


def generate(out_dir: Path = PROTO_DIR) -> list[Path]:
    """Generate the modules into `out_dir` and return the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="proto-gen-") as scratch:
        scratch_dir = Path(scratch)
        _run_protoc(scratch_dir)
        for name in generated_files():
            text = (scratch_dir / name).read_text(encoding="utf-8")
            target = out_dir / name
            target.write_text(_rewrite_imports(text), encoding="utf-8", newline="\n")
            written.append(target)
    return written


def stale_files(committed_dir: Path = PROTO_DIR) -> list[str]:
    """Generated files in `committed_dir` that are missing, differ from a fresh
    build, or are left over from an older layout."""
    committed_dir = Path(committed_dir)
    expected = generated_files()
    stale = []
    with tempfile.TemporaryDirectory(prefix="proto-check-") as fresh:
        fresh_dir = Path(fresh)
        generate(fresh_dir)
        for name in expected:
            current = committed_dir / name
            if not current.is_file() or current.read_bytes() != (fresh_dir / name).read_bytes():
                stale.append(name)
    leftovers = {
        p.name
        for pattern in ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")
        for p in committed_dir.glob(pattern)
    }
    stale += sorted(leftovers - set(expected))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proto.generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=PROTO_DIR,
        metavar="DIR",
        help=f"output directory (default: {PROTO_DIR})",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 listing the files in the output directory "
        "that differ from a fresh build",
    )
    args = parser.parse_args(argv)

    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"stale generated files in {args.out}:", file=sys.stderr)
            for name in stale:
                print(f"  {name}", file=sys.stderr)
            print("run: python -m proto.generate", file=sys.stderr)
            return 1
        print(f"generated files in {args.out} are up to date")
        return 0

    for path in generate(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
