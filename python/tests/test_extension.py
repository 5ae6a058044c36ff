"""The compiled extension as a neighbour of other extensions in one process."""
import shutil
import subprocess
import sys

import pytest

import kiln


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF dynamic symbols")
def test_the_extension_exports_its_initialiser_only():
    # Anything else exported (kiln's own symbols, fmt's, libstdc++'s where a
    # toolchain links it statically) can be bound by another extension of the
    # process in place of its own: on the GPU machine PyTorch's stringstreams
    # were destroyed through a std::locale copy inside _kiln and crashed.
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the extension's symbol table"
    listing = subprocess.run([nm, "-D", "--defined-only", kiln._kiln.__file__], capture_output=True, text=True,
                             check=True).stdout
    exported = sorted(line.split()[-1] for line in listing.splitlines() if line.split()[1:2] != ["A"])
    assert exported == ["PyInit__kiln"], f"{len(exported)} symbols exported: {exported[:10]}"
