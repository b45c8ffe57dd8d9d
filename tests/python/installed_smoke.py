"""An installed cairn package runs (tests/pip_install_test.sh): a version saved, fenced and
restored bit-exact through the default copy engine, and, where no CUDA device can be used,
the CUDA copy engine refused with a cairn.Error that says so (not a crash or an import
error). Prints "ok <engine check>" last.
    python3 installed_smoke.py DIR    (DIR: a temporary directory for the job's tiers)"""

import os
import sys

import numpy as np

import cairn

root = sys.argv[1]
o = cairn.Options()
o.job_id = f"smoke-{os.getpid()}"
o.host_root, o.pfs_root = os.path.join(root, "host"), os.path.join(root, "pfs")
o.persist_every = 0
rng = np.random.default_rng(7)
a = rng.standard_normal(1 << 18).astype(np.float32)
with cairn.Checkpointer(o) as c:
    assert c.save(1, [cairn.Shard.from_buffer("w", "float32", [a.size], a)]) == "queued"
    c.fence()
    back = np.zeros_like(a)
    r = c.restore([cairn.Shard.from_buffer("w", "float32", [a.size], back)], step=1)
    assert r.step == 1 and back.tobytes() == a.tobytes(), "restored bytes differ"

o.job_id = f"smoke-cuda-{os.getpid()}"
o.copy_engine = "cuda"
try:
    with cairn.Checkpointer(o) as c:
        engine = "cuda engine opened (a CUDA device is usable here)"
except cairn.Error as e:
    assert "CUDA" in str(e), f"the CUDA engine's refusal does not say why: {e}"
    engine = f"cuda engine refused: {e}"
print("ok", engine)
