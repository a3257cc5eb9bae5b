"""Echoes its stdin to stdout."""

import sys

sys.stdout.write(sys.stdin.read())
sys.stdout.flush()
