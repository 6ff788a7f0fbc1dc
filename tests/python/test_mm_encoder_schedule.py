"""EncoderScheduler, the scheduler's encoder bookkeeping, with exact expected values: the
budget stops a chunk before the image that does not fit, planned and cached images cost
nothing, each image is encoded once while a request holds it and freed after the last one."""

from __future__ import annotations

import numpy as np
import pytest

from pagedllm.multimodal.encoder_schedule import EncoderScheduler
from pagedllm.multimodal.prompt import ImageInput


def img(tag: bytes, offset: int, length: int = 16) -> ImageInput:
    return ImageInput(tag * 16, np.zeros((3, 2, 2), np.float32), offset, length)


def test_fit_stops_before_the_first_image_that_does_not_fit():
    enc = EncoderScheduler(20)
    a, b = img(b"a", 4), img(b"b", 30)
    ims = (a, b)
    enc.add_request(ims)
    enc.begin_step()
    assert enc.fit(ims, 0, 4) == 4      # text only
    assert enc.fit(ims, 0, 40) == 30    # a fits (16 <= 20), b would not (16 > 4 left)
    assert enc.fit(ims, 0, 20) == 20    # a alone
    enc.reserve(ims, 0, 20)
    assert enc.fit(ims, 20, 20) == 10   # a is planned, b does not fit the 4 left
    assert enc.fit((b,), 30, 4) == 0    # nothing of b this step
    out = enc.step_inputs([(ims, 0, 20, 3)])
    assert [h for h, _ in out.encode] == [a.content_hash]
    assert out.rows == [(a.content_hash, 0, 16, 7)]  # positions 4..20 -> packed rows 7..23
    enc.begin_step()
    assert enc.fit(ims, 20, 20) == 20   # a cached: costs nothing; b fits a fresh budget
    enc.reserve(ims, 20, 20)
    out = enc.step_inputs([(ims, 20, 20, 0)])
    assert [h for h, _ in out.encode] == [b.content_hash]
    assert out.rows == [(b.content_hash, 0, 10, 10)]
    assert (enc.num_encoded_images, enc.num_encoded_tokens, enc.num_cached) == (2, 32, 2)


def test_shared_images_are_encoded_once_and_freed_after_the_last_request():
    enc = EncoderScheduler(64)
    r1, r2 = (img(b"x", 0),), (img(b"x", 5),)
    enc.add_request(r1)
    enc.add_request(r2)
    enc.begin_step()
    out = enc.step_inputs([(r1, 0, 16, 0), (r2, 0, 21, 16)])
    assert len(out.encode) == 1 and len(out.rows) == 2
    enc.release_request(r1)
    assert enc.num_cached == 1  # r2 still has it
    enc.begin_step()
    assert enc.step_inputs([]) is None
    enc.release_request(r2)
    enc.begin_step()
    out = enc.step_inputs([])
    assert out.free == [b"x" * 16] and not out.encode and enc.num_cached == 0


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="max_num_encoder_tokens = 0"):
        EncoderScheduler(0)


def test_unused_outputs_are_kept_least_recently_released_first_out():
    enc = EncoderScheduler(64, keep_unused_images=1)
    x, y = (img(b"x", 0),), (img(b"y", 0),)
    for r in (x, y):
        enc.add_request(r)
    enc.begin_step()
    enc.step_inputs([(x, 0, 16, 0), (y, 0, 16, 16)])
    enc.release_request(x)          # x unused, kept (1 allowed)
    assert enc.num_cached == 2
    enc.release_request(y)          # y unused too: x, the older, goes
    enc.begin_step()
    assert enc.step_inputs([]).free == [b"x" * 16]
    enc.add_request(y)              # y again: still cached, no encode, not evictable
    enc.begin_step()
    assert enc.fit(y, 0, 16) == 16
    out = enc.step_inputs([(y, 0, 16, 0)])
    assert not out.encode and out.rows == [(b"y" * 16, 0, 16, 0)]
    enc.add_request(x)              # x was freed: it is encoded again
    enc.begin_step()
    assert [h for h, _ in enc.step_inputs([(x, 0, 16, 0)]).encode] == [b"x" * 16]
