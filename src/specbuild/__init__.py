"""specbuild: a declarative build system for EAGLE-3 drafters served by SGLang."""

__version__ = "0.1.0"
