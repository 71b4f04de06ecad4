"""The click-free bodies of `fluidctl cluster ...`: setup (the wheelhouse, venvs on nodes), check,
exec and sync."""
