"""Gateware for FPGA prototyping: the serial shell that fits a unit into a package's pins."""
