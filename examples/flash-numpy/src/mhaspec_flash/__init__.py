"""An example mhaspec backend kept outside the mhaspec package: see :mod:`mhaspec_flash.backend`."""

from .backend import FLASH, FlashNumpyBackend

__all__ = ["FLASH", "FlashNumpyBackend"]
