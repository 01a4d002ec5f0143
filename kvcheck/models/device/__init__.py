"""The device model: real K/V in a device-backed store, read back bit for bit."""
