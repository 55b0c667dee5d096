"""An out-of-tree C program uses DDP from an installed cohort.

make install PREFIX=<tmp> puts libcohort and the strategies (headers,
static and shared libraries, cohort.pc and cohort-strategies.pc) under the
prefix; examples/out-of-tree builds with pkg-config alone and trains on 2
ranks under the installed `cohort run`.
"""

import os
import re
import shutil
import subprocess

from conftest import REPO, base_env, finish, start


def test_out_of_tree_ddp_from_an_installed_prefix(tmp_path, built):
    prefix = tmp_path / "prefix"
    r = subprocess.run(["make", "-s", "install", f"PREFIX={prefix}"], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for f in ("include/cohort/cohort.h", "include/cohort/ddp.h", "lib/libcohort_strategies.so",
              "lib/pkgconfig/cohort-strategies.pc", "bin/cohort"):
        assert (prefix / f).exists(), f
    src = tmp_path / "app"
    shutil.copytree(REPO / "examples" / "out-of-tree", src)
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    r = subprocess.run(["make"], cwd=src, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    pc = subprocess.run(["pkg-config", "--cflags", "--libs", "cohort-strategies"], env=env, capture_output=True,
                        text=True, timeout=30)
    assert pc.returncode == 0 and f"-I{prefix}/include" in pc.stdout, pc.stdout + pc.stderr
    env = base_env(LD_LIBRARY_PATH=str(prefix / "lib"))
    [p] = finish([start([str(prefix / "bin" / "cohort"), "run", "-n", "2", "--", str(src / "linreg")], env)], 120)
    assert p.returncode == 0, p.out
    lines = re.findall(r"rank (\d)/2 loss=([\d.]+) checksum=([-\d.]+)", p.out)
    assert sorted(l[0] for l in lines) == ["0", "1"], p.out
    assert len({l[2] for l in lines}) == 1, f"ranks disagree: {lines}"
    assert all(float(l[1]) < 1e-3 for l in lines), lines
