"""The version, in one place: pyproject.toml and recipe/meta.yaml read it from here."""

__version__ = "0.1.0"
