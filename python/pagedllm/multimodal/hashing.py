"""Content hashes of images, and the prefix-cache ids of their placeholder positions.

`image_hash` digests the decoded RGB pixels with their size (BLAKE2b-128), so the same picture
sent as PNG or as a re-encoded PNG hashes alike and one changed pixel changes the hash.

The prefix cache keys a block by its token ids (chained; docs/ARCHITECTURE.md, PrefixCache).
Image positions all hold the same placeholder token, so the engine gives the KV-cache manager
(and the persistent tier) other ids for them: `placeholder_cache_ids(hash, n)`, n negative
int32 values drawn from BLAKE2b(hash, position) — negative, so never a real token id. A block's
key therefore carries the content hash of every image whose positions overlap it, per block:
blocks before an image keep their text-only keys and stay shared, the first block that
overlaps an image (and every later one, by the chain) differs when the image differs. A block
overlapping an image's first position would be told apart from another image's by only 31
bits per image position it holds, so `salt_image_blocks` also replaces the text ids before
the image in that first block by ids drawn from (image hash, position, token id): the block is
then keyed by block_size * 31 bits of the image, and every later block by the chain of
confirmed parents (a hit also matches the parent block id).
"""

from __future__ import annotations

import hashlib

import numpy as np
from PIL import Image

HASH_BYTES = 16
_DOMAIN = b"pagedllm-image-v1"


def image_hash(image: Image.Image) -> bytes:
    """BLAKE2b-128 of a decoded image's mode, size and pixels (16 bytes)."""
    h = hashlib.blake2b(digest_size=HASH_BYTES, person=b"pagedllm-img")
    w, ht = image.size
    h.update(_DOMAIN + image.mode.encode() + w.to_bytes(4, "little") + ht.to_bytes(4, "little"))
    h.update(image.tobytes())
    return h.digest()


def placeholder_cache_ids(digest: bytes, n: int) -> np.ndarray:
    """The prefix-cache ids of an image's n placeholder positions.

    Args:
        digest: the image's content hash (image_hash).
        n: placeholder positions.
    Returns:
        int32 [n], every value negative, a function of (digest, position).
    """
    out = bytearray()
    counter = 0
    while len(out) < 4 * n:
        out += hashlib.blake2b(digest + counter.to_bytes(8, "little"), digest_size=64).digest()
        counter += 1
    raw = np.frombuffer(bytes(out[:4 * n]), dtype="<u4") | np.uint32(0x8000_0000)
    return raw.view(np.int32).copy()


def salt_image_blocks(kv_ids: np.ndarray, images, block_size: int) -> np.ndarray:
    """kv_ids with the text positions that share a block with an image's first position
    replaced by ids drawn from (image hash, position, token id) (see the module docstring).

    Args:
        kv_ids: int32 [n], prompt ids with image positions already replaced.
        images: the prompt's ImageInputs (content_hash, offset).
        block_size: the KV block size.
    Returns:
        A new int32 [n] array (text blocks before the image's block are unchanged).
    """
    out = kv_ids.copy()
    for im in images:
        first = im.offset // block_size * block_size
        for p in range(first, im.offset):
            if out[p] < 0:
                continue  # another image's position
            seed = im.content_hash + b"pre" + int(im.offset - p).to_bytes(4, "little")
            out[p] = placeholder_cache_ids(seed + int(out[p]).to_bytes(4, "little"), 1)[0]
    return out
