"""Unpacks Debian packages (.deb) into a folder, as `dpkg-deb -x` does, with Python alone.

    python3 scripts/unpack_debs.py DEST PACKAGE.deb...

For the GPU machines (scripts/gpu_test.sh), which may have neither dpkg-deb nor xz: a .deb
is an `ar` archive whose data.tar.* member holds the files; Python's tarfile reads xz, gzip
and bzip2 (Debian 12 packs with xz). Paths are checked before anything is written: a
member or hard link outside DEST, a device file, or a symbolic link whose target leaves
DEST (absolute, or through ..) is not extracted (links are listed; anything else is an
error naming the package).
"""

import io
import os
import sys
import tarfile

AR_MAGIC = b"!<arch>\n"


def data_member(path):
    """The bytes of the data.tar.* member of the .deb at `path`."""
    with open(path, "rb") as f:
        blob = f.read()
    if not blob.startswith(AR_MAGIC):
        raise ValueError(f"{path}: not a Debian package (no ar header)")
    off = len(AR_MAGIC)
    while off + 60 <= len(blob):
        header = blob[off : off + 60]
        if header[58:60] != b"`\n":
            raise ValueError(f"{path}: corrupt ar member header at byte {off}")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        body = blob[off + 60 : off + 60 + size]
        if len(body) != size:
            raise ValueError(f"{path}: member {name} is truncated")
        if name.startswith("data.tar"):
            return name, body
        off += 60 + size + (size & 1)
    raise ValueError(f"{path}: no data.tar member")


def inside(dest, rel):
    """Whether `rel` (relative to dest) stays inside dest."""
    full = os.path.realpath(os.path.join(dest, rel))
    return full == dest or full.startswith(dest + os.sep)


def unpack(deb, dest):
    name, body = data_member(deb)
    skipped = []
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
        members = []
        for m in tar.getmembers():
            rel = os.path.normpath(m.name)
            if os.path.isabs(m.name) or not inside(dest, rel):
                raise ValueError(f"{deb}: {m.name} would be written outside {dest}")
            if m.issym():
                target = m.linkname
                if os.path.isabs(target) or not inside(dest, os.path.join(os.path.dirname(rel), target)):
                    skipped.append(f"{m.name} -> {target}")
                    continue
            elif m.islnk():
                if not inside(dest, os.path.normpath(m.linkname)):
                    raise ValueError(f"{deb}: hard link {m.name} points outside {dest}")
            elif not (m.isreg() or m.isdir()):
                raise ValueError(f"{deb}: {m.name} is not a file, folder or link")
            members.append(m)
        # Checked above; "fully_trusted" only keeps Python >= 3.12 from warning that its
        # default will change.
        kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        tar.extractall(dest, members=members, **kw)
    return skipped


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    dest = os.path.realpath(sys.argv[1])
    os.makedirs(dest, exist_ok=True)
    for deb in sys.argv[2:]:
        try:
            skipped = unpack(deb, dest)
        except (OSError, ValueError, tarfile.TarError) as e:
            sys.exit(f"unpack_debs: {e}")
        for s in skipped:
            print(f"unpack_debs: {os.path.basename(deb)}: link leaving the folder not made: {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
