"""One NPU chip ("tile") and its compute units."""
