"""Where the checkout lies, for the test modules in any folder of tests/ (scripts they run,
fixtures under tests/data)."""

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
