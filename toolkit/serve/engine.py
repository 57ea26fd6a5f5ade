"""Continuous batching on the toolkit's own GPT, for `toolkit generate --serve`: requests join and leave the running
batch at every step, each with its own length in a slot of one preallocated KV cache.

    engine = BatchEngine(model, max_num_seqs=8, max_batched_tokens=256, max_len=1024)
    engine.start()
    for token in engine.submit([5, 9, 2], max_tokens=16):   # a request's tokens as they come
        ...

Each step decodes one token for every running request past its prompt (one batched forward, each row at its own
position), then prefills one chunk of the oldest prompt still waiting within what is left of the step's token
budget (a second forward), as toolkit.estimate.serving_sim models the toolkit's engine (fused=False). Greedy.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..program.generate import KVCache

__all__ = ["SlotCache", "BatchEngine"]


class SlotCache:
    """A KV cache of `slots` rows of `max_len` positions, each row its own request and length."""

    def __init__(self, model, slots: int, max_len: int):
        base = KVCache.for_model(model, slots, max_len)
        self.keys, self.values, self.rope = base.keys, base.values, base.rope
        self.lengths = torch.zeros(slots, dtype=torch.long)

    def view(self, rows: list[int]) -> _SlotView:
        return _SlotView(self, torch.tensor(rows, dtype=torch.long))


class _SlotView:
    """The cache as the model's forward sees it for some rows: `length` one start a row (decode) or one number
    (a single row's prompt chunk)."""

    def __init__(self, cache: SlotCache, rows: torch.Tensor):
        self.cache, self.rows, self.rope = cache, rows, cache.rope
        self.length = cache.lengths[rows] if len(rows) > 1 else int(cache.lengths[rows[0]])

    def attend(self, layer: int, q, k, v):
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        grouped = q.shape[1] != keys.shape[1]
        if not torch.is_tensor(self.length):  # one row's prompt chunk: as a static cache does, on that row's view
            row, start, seq = int(self.rows[0]), self.length, q.shape[2]
            keys[row, :, start : start + seq], values[row, :, start : start + seq] = k[0], v[0]
            ks, vs = keys[row : row + 1, :, : start + seq], values[row : row + 1, :, : start + seq]
            mask = torch.ones(seq, start + seq, dtype=torch.bool).tril(start) if start else None
            return F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, is_causal=not start, enable_gqa=grouped)
        starts = self.length  # decode: one new position a row, each row at its own length
        keys[self.rows, :, starts], values[self.rows, :, starts] = k[:, :, 0], v[:, :, 0]
        width = int(starts.max()) + 1
        ks, vs = keys[self.rows, :, :width], values[self.rows, :, :width]
        mask = torch.arange(width)[None, :] <= starts[:, None]  # each row sees its own cache only
        return F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask[:, None, None], enable_gqa=grouped)

    def commit(self, steps: int) -> None:
        self.cache.lengths[self.rows] += steps


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    out: queue.Queue = field(default_factory=queue.Queue)
    slot: int = -1
    done_prompt: int = 0
    made: int = 0
    last: int = 0


class BatchEngine:
    """The scheduler and its thread. `submit` returns an iterator of the request's tokens."""

    def __init__(self, model, *, max_num_seqs: int, max_batched_tokens: int, max_len: int, cache=None):
        self.model, self.max_seqs, self.budget, self.max_len = model, max_num_seqs, max_batched_tokens, max_len
        self.cache = cache or SlotCache(model, max_num_seqs, max_len)  # (a stand-in when timing the host alone)
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: list[_Request] = []
        self.running: list[_Request] = []
        self.free = list(range(max_num_seqs))
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="toolkit-engine")

    def start(self) -> None:
        """Run the scheduler on its own thread (tests, the host measurement); `serve` runs it on the main thread."""
        self.thread.start()

    def run(self) -> None:
        """Run the scheduler on this thread until stopped. torch's intra-op threads belong to the thread that made
        them: a model stepped from a second Python thread ran 3-4x slower here (its thread pool beside the main
        one's), so the server keeps the model on the main thread and the HTTP handlers on others."""
        self._loop()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(None)

    def submit(self, prompt: list[int], max_tokens: int):
        if len(prompt) + max_tokens > self.max_len:
            raise ValueError(f"prompt {len(prompt)} + max_tokens {max_tokens} exceed the context of {self.max_len}")
        req = _Request(list(prompt), max_tokens)
        self.inbox.put(req)
        while (token := req.out.get()) is not None:
            yield token

    @torch.inference_mode()
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take(block=not self.running and not self.waiting)
            while self.waiting and self.free:
                req = self.waiting.pop(0)
                req.slot = self.free.pop()
                self.cache.lengths[req.slot] = 0
                self.running.append(req)
            if self.running:
                self._step()

    def _take(self, block: bool) -> None:
        try:
            item = self.inbox.get(block=block)
            while item is not None:
                self.waiting.append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def _step(self) -> None:
        decoding = [r for r in self.running if r.done_prompt == len(r.prompt)]
        if decoding:
            view = self.cache.view([r.slot for r in decoding])
            tokens = torch.tensor([[r.last] for r in decoding])
            logits = self.model(tokens, cache=view)
            view.commit(1)
            for r, t in zip(decoding, logits[:, -1].argmax(-1).tolist()):
                self._emit(r, t)
        room = self.budget - len(decoding)
        prefilling = [r for r in self.running if r.done_prompt < len(r.prompt)]
        if prefilling and room > 0:
            r = prefilling[0]
            chunk = r.prompt[r.done_prompt : r.done_prompt + room]
            view = self.cache.view([r.slot])
            logits = self.model(torch.tensor([chunk]), cache=view)
            view.commit(len(chunk))
            r.done_prompt += len(chunk)
            if r.done_prompt == len(r.prompt):  # the last chunk samples the first token
                self._emit(r, int(logits[0, -1].argmax()))
        for r in [r for r in self.running if r.made >= r.max_tokens]:
            self.running.remove(r)
            self.free.append(r.slot)
            r.out.put(None)

    def _emit(self, r: _Request, token: int) -> None:
        r.last = token
        r.made += 1
        r.out.put(token)
