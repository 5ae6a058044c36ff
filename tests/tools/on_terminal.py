"""Runs a command with stdout and stderr on a pseudo-terminal (as a user at
a terminal would see it) and prints what it wrote, each carriage return shown
as <CR> and a line break, so FileCheck can see lines rewritten in place.
Exits with the command's status."""
import os
import pty
import subprocess
import sys

leader, follower = pty.openpty()
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
os.close(follower)
written = bytearray()
while True:
    try:
        chunk = os.read(leader, 65536)
    except OSError:  # EIO: the command closed the terminal
        break
    if not chunk:
        break
    written += chunk
sys.stdout.write(written.decode(errors="replace").replace("\r\n", "\n").replace("\r", "<CR>\n"))
sys.exit(child.wait())
