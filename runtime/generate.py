"""Text generation: token ids in, token ids out.

    from runtime import load, generate
    model = load("out/gpt2-kv")                       # fgc compile ... --target onnx --kv-cache
    ids = generate(model, [[464, 2068, 7586]], max_new_tokens=20)           # greedy
    ids = generate(model, [[464, 2068, 7586]], 20, temperature=0.8, top_k=50, top_p=0.95,
                   seed=0, stop=[50256])

`model` is an ONNX model fgc compiled (`runtime.Model`), or the PyTorch module it emitted
(`build()` from its model.py). A model with the incremental form (an ONNX graph compiled
with `--kv-cache`; every torch module of an autoregressive spec, through `step()`) runs
the prompt once and then one token per call, keeping each attention's keys and values;
any other model recomputes the whole prefix at every step (`cache=False` asks for that
too). Token ids are 0-based, as the compiled models take them; tokenizers are the
caller's.

Prompts may differ in length where the model takes a padding mask (a spec's
`attention_mask: Pad[n]`): they are padded on the left, the mask says where, and every row
is what generating its prompt alone gives (positions count each row's own tokens). Each
row stops at its own stop id; `stop` may also give one list of stop ids per row.

Sampling follows the usual order: the logits divided by the temperature, cut to the
`top_k` most likely, then to the smallest set whose probability reaches `top_p`, then one
id drawn with numpy's generator seeded by `seed`: one generator per row, seeded by `seed`
and the row's prompt, so that a prompt draws the same ids in any batch. Without
temperature, top-k or top-p (or with `greedy=True`) the most likely id is taken.
"""

from __future__ import annotations

import numpy as np

from .segments import read_signature, run_segments
from .session import Model, RuntimeError_


class Sampler:
    """Picks the next id of each sequence from its logits."""

    def __init__(self, greedy: bool | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None):
        sampling = temperature is not None or top_k is not None or top_p is not None
        if greedy and sampling:
            raise RuntimeError_("greedy decoding takes no temperature, top-k or top-p")
        if temperature is not None and not temperature > 0:
            raise RuntimeError_(f"temperature {temperature}: give a positive number")
        if top_k is not None and top_k < 1:
            raise RuntimeError_(f"top-k {top_k}: give a positive number")
        if top_p is not None and not 0 < top_p <= 1:
            raise RuntimeError_(f"top-p {top_p}: give a number in (0, 1]")
        self.greedy = not sampling if greedy is None else greedy
        self.temperature = temperature or 1.0
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.rows: list | None = None  # one generator per row (`per_row`)

    def per_row(self, prompts: list[list[int]]) -> None:
        """A generator for each row, seeded by the seed and the row's prompt: a prompt draws
        the same ids whatever else is in its batch."""
        self.rows = [np.random.default_rng([self.seed, len(p), *p]) for p in prompts] \
            if self.seed is not None else None

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """One id per row of `logits` [batch, vocabulary]."""
        if self.greedy:  # (the same id in the logits' own type)
            return np.asarray(logits).argmax(-1)
        z = np.asarray(logits, dtype=np.float64)
        z = z / self.temperature
        if self.top_k is not None and self.top_k < z.shape[-1]:
            kth = np.partition(z, -self.top_k, axis=-1)[:, -self.top_k][:, None]
            z = np.where(z < kth, -np.inf, z)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        if self.top_p is not None and self.top_p < 1:
            order = np.argsort(-p, axis=-1, kind="stable")
            sorted_p = np.take_along_axis(p, order, -1)
            before = np.cumsum(sorted_p, -1) - sorted_p  # mass of the likelier ids
            drop = np.zeros_like(p, dtype=bool)
            np.put_along_axis(drop, order, before >= self.top_p, -1)
            p = np.where(drop, 0.0, p)
            p /= p.sum(-1, keepdims=True)
        u = self.rng.random((p.shape[0], 1)) if self.rows is None else \
            np.array([[g.random()] for g in self.rows])
        picked = (np.cumsum(p, -1) < u).sum(-1)
        return np.minimum(picked, p.shape[-1] - 1)


def generate(model, prompt, max_new_tokens: int, *, greedy: bool | None = None,
             temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, stop=(),
             max_length: int | None = None, inputs: dict | None = None,
             cache: bool = True) -> list[list[int]]:
    """The new ids of each prompt (a list of ids, or lists for a batch, of any lengths where
    the model takes a padding mask): at most `max_new_tokens`, fewer where a `stop` id came
    (it is kept) or the sequence reached `max_length` positions. `stop` is a list of ids,
    or one list per row. `inputs` are the model's other inputs (an encoder's source), the
    same at every step."""
    runner = _runner(model, cache)
    rows = _rows(prompt)
    if any(not r for r in rows):
        raise RuntimeError_("the prompt is empty: give at least one id")
    mask = None
    if len({len(r) for r in rows}) > 1:  # left-padded, the mask saying where
        if runner.pad is None:
            raise RuntimeError_("prompts of different lengths need a model that takes a "
                                "padding mask (a spec input `attention_mask: Pad[n]`); "
                                "give prompts of one length")
        width = max(len(r) for r in rows)
        ids = np.array([[0] * (width - len(r)) + list(r) for r in rows], np.int64)
        mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int64)
    else:
        ids = np.asarray(rows, dtype=np.int64)
    if max_new_tokens < 0:
        raise RuntimeError_(f"max new tokens {max_new_tokens}: give a number >= 0")
    vocab = runner.vocabulary
    if vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
        raise RuntimeError_(f"prompt ids must be in 0..{vocab - 1} (0-based)")
    limit = runner.max_length
    if max_length is not None:
        if limit is not None and max_length > limit:
            raise RuntimeError_(f"max length {max_length}: the model takes at most {limit} "
                                "positions")
        limit = max_length
    if limit is not None:
        if ids.shape[1] > limit:
            raise RuntimeError_(f"the prompt has {ids.shape[1]} ids; the model takes at most "
                                f"{limit} positions")
        if max_length is None and ids.shape[1] + max_new_tokens > limit:
            raise RuntimeError_(f"{ids.shape[1]} prompt ids and {max_new_tokens} new ones "
                                f"exceed the model's {limit} positions; give fewer new "
                                "tokens, or a max length (--max-length) to stop there")
        max_new_tokens = min(max_new_tokens, limit - ids.shape[1])
    sampler = Sampler(greedy, temperature, top_k, top_p, seed)
    sampler.per_row(rows)
    stops = _stops(stop, len(rows))
    given = dict(inputs or {})
    missing = [n for n in runner.others if n not in given and n not in runner.optional]
    if missing:
        raise RuntimeError_(f"give the model's input {', '.join(missing)} (it is the same at "
                            "every step)")
    unknown = set(given) - set(runner.others)
    if unknown:
        raise RuntimeError_(f"the model has no other input {', '.join(sorted(unknown))}")
    fixed = runner.fixed(given)
    batch = ids.shape[0]
    new = np.zeros((batch, 0), np.int64)
    done = np.zeros(batch, bool)
    if max_new_tokens == 0:
        return [[] for _ in range(batch)]
    logits = runner.start(ids, fixed, mask, room=ids.shape[1] + max_new_tokens)
    while True:
        nxt = sampler(logits)
        if any(stops):
            nxt = np.where(done, new[:, -1] if new.shape[1] else nxt, nxt)
            done |= np.array([int(t) in s for t, s in zip(nxt, stops)])
        new = np.concatenate([new, nxt[:, None]], 1)
        if new.shape[1] >= max_new_tokens or done.all():
            break
        if mask is not None:  # the new token of every row is a token
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], 1)
        logits = runner.next(nxt[:, None], fixed, mask)
    out = []
    for row, ends in zip(new.tolist(), stops):
        cut = next((k + 1 for k, t in enumerate(row) if t in ends), len(row))
        out.append(row[:cut])
    return out


def _rows(prompt) -> list[list[int]]:
    """The prompt as rows of ids: a list of ids is one row."""
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    prompt = list(prompt)
    if not prompt:
        return [[]]
    if all(np.ndim(x) == 0 for x in prompt):
        return [[int(x) for x in prompt]]
    if not all(np.ndim(r) == 1 for r in prompt):
        raise RuntimeError_("the prompt is a list of ids, or a list of such lists")
    return [[int(x) for x in r] for r in prompt]


def _stops(stop, batch: int) -> list[set[int]]:
    """Each row's stop ids: the same list for every row, or one list per row."""
    stop = list(stop)
    if stop and all(np.ndim(s) == 1 for s in stop):
        if len(stop) != batch:
            raise RuntimeError_(f"{len(stop)} lists of stop ids for {batch} prompts: give "
                                "one list, or one per prompt")
        return [{int(t) for t in s} for s in stop]
    return [{int(t) for t in stop}] * batch


# ---------------------------------------------------------------- the runners: a key/value
# cache (ONNX or torch), a model's own state, or the prefix recomputed


def _runner(model, cache: bool):
    if _state_of(model):
        return _StateRunner(model, cache)
    if isinstance(model, Model):
        return _OnnxRunner(model, cache)
    if callable(getattr(model, "signature", None)) or callable(getattr(model, "logits", None)):
        return _TorchRunner(model, cache)
    raise RuntimeError_("generate takes a runtime.Model (ONNX) or a PyTorch module fgc "
                        "compiled")


class _OnnxRunner:
    def __init__(self, model: Model, cache: bool):
        self.model = model
        sig = model.signature
        inc = sig.incremental
        self.cached = bool(inc) and cache
        self.inc = inc
        names = [i["name"] for i in sig.inputs]
        self.tokens = inc["tokens"] if inc else _token_input(sig.inputs)
        spec = sig.input(self.tokens)
        self.pad, self.optional = _padding(sig.inputs, spec)
        self.others = [n for n in names if n not in (self.tokens, self.pad)]
        self.vocabulary = spec["hi"] - spec["lo"] + 1
        axis = spec["dims"][1]
        self.max_length = sig.max_length.get(axis)
        outs = model.outputs
        self.logits_name = sig.logits["name"] if sig.logits else \
            "logits" if "logits" in outs else None  # a graph fgc did not write
        if self.logits_name is None:
            raise RuntimeError_("the model has no `logits` output to pick tokens from")
        self.prefix: np.ndarray | None = None

    def fixed(self, given: dict) -> dict:
        return {k: np.asarray(v) for k, v in given.items()}

    def start(self, ids: np.ndarray, fixed: dict, mask: np.ndarray | None = None, *,
              room: int) -> np.ndarray:
        """The prompt's logits; `room`: how many positions the run may reach (a graph that
        shares its past and present buffers gets buffers that long)."""
        padded = {self.pad: mask} if mask is not None else {}
        checked = self.model.check({**fixed, self.tokens: ids, **padded})
        self.fixed_checked = {k: checked[k] for k in self.others}
        # no past yet (the prefill form): the checked feeds hold it empty
        self.empty = {c["past"]: checked[c["past"]] for c in (self.inc or {}).get("cache", [])}
        if not self.cached:
            self.prefix = checked[self.tokens]
            return self._full(mask)
        shared = bool(self.inc.get("share_buffer")) and self.pad is not None
        self.buffers = _Buffers(self.model, self.inc["cache"], ids.shape[0], room,
                                self.logits_name, self.fixed_checked,
                                None if shared else self.empty)
        return self._step(checked[self.tokens], mask)

    def next(self, ids: np.ndarray, fixed: dict, mask: np.ndarray | None = None
             ) -> np.ndarray:
        if not self.cached:
            self.prefix = np.concatenate([self.prefix, ids], 1)
            return self._full(mask)
        return self._step(ids, mask)

    def _padding(self, mask: np.ndarray | None, ones) -> dict:
        """The padding mask's feed: `ones()`, a mask of no padding, where none is given."""
        if self.pad is None:
            return {}
        return {self.pad: mask if mask is not None else ones()}

    def _run(self, names: list[str], feeds: dict) -> list:
        try:
            return self.model.session.run(names, feeds)
        except Exception as e:  # noqa: BLE001 - onnxruntime's errors are one class per cause
            raise RuntimeError_(f"onnxruntime failed: {str(e)[:300]}") from None

    def _full(self, mask: np.ndarray | None) -> np.ndarray:
        padding = self._padding(mask, lambda: np.ones(self.prefix.shape, np.int64))
        (logits,) = self._run([self.logits_name], {**self.fixed_checked, **padding,
                                                   self.tokens: self.prefix, **self.empty})
        return logits[:, -1]

    def _step(self, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        width = self.buffers.length + ids.shape[1]
        padding = self._padding(mask, lambda: self.buffers.mask(width))
        return self.buffers.step({**padding, self.tokens: ids}, ids.shape[1])


class _Buffers:
    """A run's steps through onnxruntime's IO binding. The inputs that do not change (the
    model's other inputs) are bound once; a one-token step writes its logits into one
    buffer bound once too, and reads the padding mask of a batch without padding from a
    buffer of ones. The cache stays onnxruntime's own:

    * shared (GroupQueryAttention's past_present_share_buffer, where the signature says
      every cached attention takes it: `share_buffer`): one buffer per past and present
      tensor, as long as the run may grow, bound once as both; each step writes its keys
      and values in place, and nothing is concatenated or copied;
    * otherwise (`empty`: the pasts of the prefill form) each step's presents are the next
      step's pasts as onnxruntime gave them, never turned into numpy arrays."""

    def __init__(self, model: Model, cache: list[dict], batch: int, room: int, logits: str,
                 fixed: dict, empty: dict | None = None):
        import onnxruntime as ort
        self.session = model.session
        self.logits = logits
        self.length = 0  # positions the cache holds
        self.binding = self.session.io_binding()
        real = model.real
        self.cache = cache
        self.shared = empty is None
        self.values = []
        for c in cache:
            if self.shared:
                dims = [batch if d == "batch" else room if isinstance(d, str) else d
                        for d in c["dims"]]
                value = ort.OrtValue.ortvalue_from_numpy(np.zeros(dims, real))
            else:
                value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(empty[c["past"]]))
            self.values.append(value)
            self.binding.bind_ortvalue_input(c["past"], value)
            if self.shared:
                self.binding.bind_ortvalue_output(c["present"], value)
            else:  # (bound first: the outputs come back in the order first bound)
                self.binding.bind_output(c["present"])
        self.held: dict[str, np.ndarray] = {}  # what is bound, alive while it is
        for name, x in fixed.items():
            self._bind(name, x)
        # the mask of `width` positions of every row, where no row is padded: the first
        # batch * width ones, contiguous
        self.ones = np.ones(batch * room, np.int64)
        self.batch = batch
        vocabulary = next((o.shape[-1] for o in self.session.get_outputs()
                           if o.name == logits), None)
        self.one = None  # a one-token step's logits [batch, 1, V], where V is known
        if isinstance(vocabulary, int):
            self.one = np.empty((batch, 1, vocabulary), real)
            self.one_value = ort.OrtValue.ortvalue_from_numpy(self.one)
        self.bound_one = False

    def mask(self, width: int) -> np.ndarray:
        return self.ones[:self.batch * width].reshape(self.batch, width)

    def _bind(self, name: str, x: np.ndarray) -> None:
        self.held[name] = np.ascontiguousarray(x)  # onnxruntime may read the array's memory
        self.binding.bind_cpu_input(name, self.held[name])

    def step(self, feeds: dict, new: int) -> np.ndarray:
        for name, x in feeds.items():
            self._bind(name, x)
        if not self.shared and self.length:  # the last step's presents: this one's pasts
            for c, value in zip(self.cache, self.values):
                self.binding.bind_ortvalue_input(c["past"], value)
                self.binding.bind_output(c["present"])  # onnxruntime allocates it anew
        one = new == 1 and self.one is not None
        if one and not self.bound_one:
            self.binding.bind_ortvalue_output(self.logits, self.one_value)
        elif not one:
            self.binding.bind_output(self.logits)  # of this step's shape
        self.bound_one = one
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError_(f"onnxruntime failed: {str(e)[:300]}") from None
        self.length += new
        outputs = None
        if not self.shared:
            outputs = self.binding.get_outputs()
            self.values = list(outputs[:len(self.cache)])
        if one:
            return self.one[:, -1]  # read before the next step writes it
        if outputs is None:
            outputs = self.binding.get_outputs()
        return outputs[len(self.cache)].numpy()[:, -1]


class _TorchRunner:
    def __init__(self, module, cache: bool):
        import torch
        self.torch = torch
        self.module = module
        sig = read_signature(module)
        inc = sig.incremental if sig else None
        self.cached = bool(inc) and cache and callable(getattr(module, "step", None))
        if not callable(getattr(module, "logits", None)):
            raise RuntimeError_("the module has no logits(): its output is not a softmax "
                                "over the vocabulary")
        inputs = sig.inputs if sig else [{"name": "x", "dims": ["batch", "T"]}]
        self.tokens = inc["tokens"] if inc else _token_input(inputs) if sig else "x"
        spec = next(i for i in inputs if i["name"] == self.tokens)
        self.pad, self.optional = _padding(inputs, spec)
        # the inputs forward() takes in order; padding masks are its keywords
        self.order = [i["name"] for i in inputs if not i.get("pad")]
        self.others = [n for n in self.order if n != self.tokens]
        self.max_length = sig.max_length.get(spec["dims"][1]) if sig else None
        self.vocabulary = spec["hi"] - spec["lo"] + 1 if "hi" in spec else None
        first = next(module.parameters(), None)
        self.device = first.device if first is not None else None
        self.past = None
        self.prefix = None

    def fixed(self, given: dict) -> dict:
        return {k: self.torch.as_tensor(np.asarray(v), device=self.device)
                for k, v in given.items()}

    def _args(self, fixed: dict, ids) -> list:
        return [ids if n == self.tokens else fixed[n] for n in self.order]

    def start(self, ids: np.ndarray, fixed: dict, mask: np.ndarray | None = None, *,
              room: int) -> np.ndarray:
        self.past = self.prefix = None  # step() without a past is the prefill form
        return self.next(ids, fixed, mask)

    def next(self, ids: np.ndarray, fixed: dict, mask: np.ndarray | None = None
             ) -> np.ndarray:
        ids = self.torch.as_tensor(ids, device=self.device)
        padded = {} if mask is None else {
            self.pad: self.torch.as_tensor(mask, device=self.device)}
        with self.torch.inference_mode():
            if self.cached:
                logits, self.past = self.module.step(*self._args(fixed, ids), past=self.past,
                                                     **padded)
            else:  # the whole prefix again
                self.prefix = ids if self.prefix is None else self.torch.cat([self.prefix, ids], 1)
                logits = self.module.logits(*self._args(fixed, self.prefix), **padded)
        return logits[:, -1].float().cpu().numpy()


def _state_of(model) -> dict:
    """{state output: input} of a model that returns its next input (`Mem'`), or {}."""
    sig = read_signature(model)
    return dict(sig.state) if sig else {}


class _StateRunner:
    """A model with recurrent state (Transformer-XL's memory): the prompt in segments,
    then one token per call with the state the previous call returned; without `cache`,
    the whole prefix again from an empty state. Scores are the log of the probabilities
    when the model has no `logits` output (an adaptive softmax)."""

    def __init__(self, model, cache: bool):
        self.model = model
        self.cached = cache
        self.onnx = isinstance(model, Model)
        sig = self.sig = read_signature(model)
        state = sig.state
        inputs = [i for i in sig.inputs if i["name"] not in state.values()]
        if len(inputs) != 1:
            raise RuntimeError_("generation with a state takes a model with one input "
                                "besides its state")
        self.tokens = inputs[0]["name"]
        self.others: list[str] = []  # nothing but the tokens and the state
        self.pad, self.optional = None, set()
        self.vocabulary = inputs[0].get("hi", 0) - inputs[0].get("lo", 0) + 1 \
            if "hi" in inputs[0] else None
        outs = [o["name"] for o in sig.outputs if o["name"] not in state]
        # the logits where the graph gives them (the torch module's forward does not)
        self.scores = sig.logits["name"] if sig.logits and self.onnx else outs[0]
        self.log = self.scores != (sig.logits or {}).get("name")
        self.max_length = None  # the memory carries the context: no limit on positions
        self.state = None
        self.prefix = None
        if not self.onnx:
            import torch
            self.torch = torch
            first = next(model.parameters(), None)
            self.device = first.device if first is not None else None

    def fixed(self, given: dict) -> dict:
        return given

    def _run(self, ids: np.ndarray, state):
        x = ids if self.onnx else self.torch.as_tensor(ids, device=self.device)
        if self.onnx:
            outputs, state = run_segments(self.model, {self.tokens: x}, state=state,
                                          signature=self.sig)
        else:
            with self.torch.inference_mode():
                outputs, state = run_segments(self.model, {self.tokens: x}, state=state,
                                              signature=self.sig)
        last = outputs[self.scores][:, -1]
        # in float32: a float16 graph's 1e-30 floor below would be 0, and its log -inf
        last = last.astype(np.float32) if self.onnx else last.float().cpu().numpy()
        return (np.log(np.maximum(last, 1e-30)) if self.log else last), state

    def start(self, ids: np.ndarray, fixed: dict, mask=None, *, room: int) -> np.ndarray:
        self.prefix = ids
        scores, self.state = self._run(ids, None)
        return scores

    def next(self, ids: np.ndarray, fixed: dict, mask=None) -> np.ndarray:
        self.prefix = np.concatenate([self.prefix, ids], 1)
        if not self.cached:
            scores, _ = self._run(self.prefix, None)
            return scores
        scores, self.state = self._run(ids, self.state)
        return scores


def _padding(inputs: list[dict], tokens: dict) -> tuple[str | None, set[str]]:
    """The padding mask of the token input's positions (None: the model takes none), and
    every padding mask: a caller may leave each out."""
    pads = [i for i in inputs if i.get("pad")]
    along = next((i["name"] for i in pads if i["dims"][-1] == tokens["dims"][-1]), None)
    return along, {i["name"] for i in pads}


def _token_input(inputs: list[dict]) -> str:
    """The input a model without the incremental form generates along: of its inputs of
    ids, the one over the most values (the vocabulary, not segments); the last of equals
    (the target, after an encoder's source)."""
    ids = [i for i in inputs if i["dtype"] == "int" and not i.get("perm") and not i.get("pad")
           and len(i["dims"]) == 2]
    if not ids:
        raise RuntimeError_("the model has no input of token ids")
    widest = max(i["hi"] - i["lo"] for i in ids)
    return [i["name"] for i in ids if i["hi"] - i["lo"] == widest][-1]
