"""npu-scale gateware (Amaranth 0.5). Never imports `sim`."""
