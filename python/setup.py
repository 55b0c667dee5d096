"""Bundles the built libcohort.so and cohortd into the wheel when present.

``pip install ./python`` from a built checkout (``make`` first) gives a
package that needs nothing else from the tree: the library and the
coordinator program are copied into ``cohort/_bundled``. Without a build the
package still installs and finds an installed libcohort at import time.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, os.pardir, "build")


class BuildWithLibrary(build_py):
    def run(self) -> None:
        super().run()
        dest = os.path.join(self.build_lib, "cohort", "_bundled")
        for src in (os.path.join(BUILD, "lib", "libcohort.so"), os.path.join(BUILD, "bin", "cohortd"),
                    os.path.join(BUILD, "bin", "cohort")):
            if os.path.isfile(src):
                os.makedirs(dest, exist_ok=True)
                shutil.copy2(src, dest)


setup(cmdclass={"build_py": BuildWithLibrary})
