"""The budget a pack is measured in: real cl100k_base tokens (``tokens``),
and what an item of a pack costs in them, exactly (``items``). Pure; the
snapshot build and the packer both count here, so they agree."""
