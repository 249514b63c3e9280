"""Local control plane for tests and the demo."""
