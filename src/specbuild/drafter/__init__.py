"""EAGLE-3 drafter: model (`model`), training (`train`), data (`data`), metrics (`metrics`)."""

from specbuild.drafter.model import DrafterCache, DrafterConfig, Eagle3Drafter

__all__ = ["DrafterCache", "DrafterConfig", "Eagle3Drafter"]
