"""ChipSystem under Verilator with a C++ host: no Python per cycle (``--backend verilator``)."""
