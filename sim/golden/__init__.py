"""Bit-exact NumPy golden models of every hardware block; they import only `hw.spec`."""
