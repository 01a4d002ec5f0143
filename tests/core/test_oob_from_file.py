"""--out-of-blocks file.py:Name names the same class the target file.py:Cls raises."""

import subprocess
import sys
import textwrap


def test_out_of_blocks_class_from_the_targets_own_file(tmp_path):
    src = tmp_path / "alloc.py"
    src.write_text(textwrap.dedent('''
        from kvcheck.impl.block_manager import BlockManager
        from kvcheck.impl.errors import OutOfBlocks


        class Full(Exception):
            pass


        class Alloc(BlockManager):
            def allocate(self, seq, n):
                try:
                    return super().allocate(seq, n)
                except OutOfBlocks:
                    raise Full("full") from None

            def append_slot(self, seq):
                try:
                    return super().append_slot(seq)
                except OutOfBlocks:
                    raise Full("full") from None
    '''))
    base = [sys.executable, "-m", "kvcheck", "verify", f"{src}:Alloc", "--blocks", "8", "--ops", "2000"]
    unnamed = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert unnamed.returncode == 1 and "raised Full" in unnamed.stdout
    named = subprocess.run([*base, "--out-of-blocks", f"{src}:Full"], capture_output=True, text=True,
                           timeout=300)
    assert named.returncode == 0, named.stdout + named.stderr
