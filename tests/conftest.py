import sys
from pathlib import Path

# The buggy-allocator corpus is importable as `corpus` from every test.
sys.path.insert(0, str(Path(__file__).parent))
