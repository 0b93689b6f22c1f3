"""Cycle-level runners: Amaranth simulator helpers and Verilator through cocotb."""
