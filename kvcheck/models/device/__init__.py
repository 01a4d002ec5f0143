"""The device model: real K/V in a device-backed store, read back bit for bit.

``model`` (operations as data: the block manager's four and the batched decode step;
scopes, exploration and shrink moves; registered as ``device``), ``datatarget`` (what a
data target offers, and the target as the structural oracle drives it), ``oracle`` (the
run state, ``DataOracle``: the block manager's oracle plus the K/V comparison; the only
part that imports torch).
"""

from kvcheck.models.device.model import MODEL, DecodeStep, DeviceModel, DeviceScope

__all__ = ["MODEL", "DecodeStep", "DeviceModel", "DeviceScope"]
