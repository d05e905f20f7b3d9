"""The README's example (example.py) runs against a real lockd: ``python3 -m unittest
test_example`` (lockd found as test_conformance finds it)."""

import os
import re
import unittest

import example
from test_conformance import World


class Example(unittest.TestCase):
    def test_the_readme_example_runs(self):
        world = World({}, "")
        saved = os.environ.get("LOCKD_ADDR")
        os.environ["LOCKD_ADDR"] = world.addr
        try:
            self.assertRegex(example.example(), re.compile(r"\Adeployed with fencing token \d+\Z"))
        finally:
            if saved is None:
                os.environ.pop("LOCKD_ADDR", None)
            else:
                os.environ["LOCKD_ADDR"] = saved
            world.stop()


if __name__ == "__main__":
    unittest.main()
