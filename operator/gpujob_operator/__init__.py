"""gpujob operator."""
