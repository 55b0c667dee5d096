"""The package as a user installs it: `pip install ./python`, then `import cohort.torch`."""

import subprocess
import sys

from conftest import PYDIR, base_env, free_port


def test_pip_install_bundles_the_library(tmp_path, built):
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(PYDIR)],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    env = base_env()
    env["PYTHONPATH"] = str(target)  # not the source tree
    env.pop("COHORT_COHORTD", None)
    code = (
        "import cohort, cohort.torch, torch.distributed as dist;"
        "print(cohort.library_path); print(cohort.find_binary('cohortd'));"
        "print('cohort' in dist.Backend._plugins or 'COHORT' in dist.Backend._plugins)"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lib, cohortd, registered = r.stdout.split()
    assert lib.startswith(str(target)) and lib.endswith("_bundled/libcohort.so"), lib
    assert cohortd.startswith(str(target)), cohortd
    assert registered == "True"
    # No import at all: torch finds the backend through the package's entry point.
    code = (
        "import os, torch, torch.distributed as dist;"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT']);"
        "dist.init_process_group('cohort', rank=0, world_size=1);"
        "x = torch.ones(3); dist.all_reduce(x);"
        "print(dist.get_backend(), dist.group.WORLD.group_name, x.tolist()); dist.destroy_process_group()"
    )
    env["PORT"] = str(free_port())
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split("\n")[0] == "cohort 0 [1.0, 1.0, 1.0]", r.stdout


def test_library_from_environment(tmp_path, built):
    """COHORT_LIBRARY names the library to load; a wrong one is a clear ImportError."""
    lib = PYDIR.parent / "build" / "lib" / "libcohort.so"
    env = base_env(COHORT_LIBRARY=str(lib))
    r = subprocess.run([sys.executable, "-c", "import cohort; print(cohort.library_path)"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(lib), r.stdout + r.stderr
    for bad in (tmp_path / "nope.so", PYDIR / "pyproject.toml"):
        env = base_env(COHORT_LIBRARY=str(bad))
        r = subprocess.run([sys.executable, "-c", "import cohort"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0, r.stdout
        assert "ImportError: cannot load libcohort.so" in r.stderr and str(bad) in r.stderr, r.stderr
