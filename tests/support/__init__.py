"""Shared helpers for the test tiers."""
