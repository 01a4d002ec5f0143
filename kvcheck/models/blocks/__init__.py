"""The block-manager model."""
