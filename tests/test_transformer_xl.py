"""Transformer-XL (specs/transformer_xl.fgpt) against the authors' formula, segment by segment.

The reference below is written from kimiyoung/transformer-xl's pytorch/mem_transformer.py
(MemTransformerLM with RelPartialLearnableMultiHeadAttn, post-norm, and the adaptive softmax
of utils/proj_adaptive_softmax.py with div_val = 1), in plain torch and with that code's own
module and tensor names: its state_dict is the checkpoint `fgc compile --weights` reads. It
computes each segment from an explicit memory, the layer inputs at the last <= m positions
before it, as `_update_mems` keeps them, with the code's own tricks (positions counted down,
the zero-pad `_rel_shift`), none of which the spec uses.

A long sequence (several segments, the last one short) then goes through the compiled
PyTorch module and the ONNX graph (onnxruntime, CPU) with `runtime.run_segments`, which
starts from an empty memory and feeds each call's `Mem'` back as the next `Mem`: at every
position the probabilities, and at the end the memory, equal the reference's to 1e-5.
The parameter count of the base preset is checked against a formula written from the same
code's module structure (151,107,538; the paper's "151M").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import ROOT, fgc, peaked_weights

from compiler.emit import compile_spec
from runtime import load as load_onnx
from runtime import run_segments

torch = pytest.importorskip("torch")
nn = torch.nn
F_ = torch.nn.functional
safetensors_torch = pytest.importorskip("safetensors.torch")

SPEC = "specs/transformer_xl.fgpt"
TOL = 1e-5


@dataclass(frozen=True)
class Config:
    L: int
    H: int
    A: int
    F: int
    V: int
    n: int  # segment length (tgt_len)
    m: int  # memory length (mem_len)
    cutoffs: tuple[int, int, int]
    B: int  # batch
    total: int  # tokens in the whole sequence

    @property
    def D(self) -> int:
        return self.H // self.A

    def sets(self) -> dict:
        c1, c2, c3 = self.cutoffs
        return {"L": self.L, "H": self.H, "A": self.A, "F": self.F, "V": self.V, "n": self.n,
                "m": self.m, "c1": c1, "c2": c2, "c3": c3}


CONFIGS = {
    # segments of 4, 4, 4, 2 tokens; memory 6 > n: it fills up over two segments
    "L2-A2-n4-m6": Config(L=2, H=16, A=2, F=40, V=23, n=4, m=6, cutoffs=(8, 12, 18), B=2,
                          total=14),
    # three heads (D = 8), three layers, memory 3 < n: only part of a segment is kept
    "L3-A3-n5-m3": Config(L=3, H=24, A=3, F=36, V=29, n=5, m=3, cutoffs=(6, 11, 20), B=3,
                          total=12),
}


# ---------------------------------------------------------------- the authors' model


class PositionalEmbedding(nn.Module):
    def __init__(self, demb: int):
        super().__init__()
        inv_freq = 1 / (10000 ** (torch.arange(0.0, demb, 2.0) / demb))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, pos_seq):
        sinusoid_inp = torch.outer(pos_seq, self.inv_freq)
        return torch.cat([sinusoid_inp.sin(), sinusoid_inp.cos()], dim=-1)


def rel_shift(x):
    """The code's _rel_shift, batch first: (B, heads, qlen, klen)."""
    b, a, q, k = x.shape
    padded = torch.cat([x.new_zeros(b, a, q, 1), x], dim=-1).view(b, a, k + 1, q)
    return padded[:, :, 1:].reshape(b, a, q, k)


class RelPartialLearnableMultiHeadAttn(nn.Module):
    def __init__(self, n_head: int, d_model: int, d_head: int):
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.scale = 1 / (d_head ** 0.5)

    def forward(self, w, r, r_w_bias, r_r_bias, attn_mask, mems):
        bsz, qlen = w.shape[:2]
        w_heads = self.qkv_net(torch.cat([mems, w], 1))
        r_head_k = self.r_net(r).view(r.shape[0], self.n_head, self.d_head)
        w_head_q, w_head_k, w_head_v = torch.chunk(w_heads, 3, dim=-1)
        w_head_q = w_head_q[:, -qlen:].view(bsz, qlen, self.n_head, self.d_head)
        klen = w_head_k.shape[1]
        w_head_k = w_head_k.view(bsz, klen, self.n_head, self.d_head)
        w_head_v = w_head_v.view(bsz, klen, self.n_head, self.d_head)
        AC = torch.einsum("bind,bjnd->bnij", w_head_q + r_w_bias, w_head_k)
        BD = rel_shift(torch.einsum("bind,jnd->bnij", w_head_q + r_r_bias, r_head_k))
        attn_score = (AC + BD) * self.scale
        attn_score = attn_score.masked_fill(attn_mask[None, None], -math.inf)
        attn_prob = F_.softmax(attn_score, dim=-1)
        attn_vec = torch.einsum("bnij,bjnd->bind", attn_prob, w_head_v)
        attn_out = self.o_net(attn_vec.reshape(bsz, qlen, self.n_head * self.d_head))
        return self.layer_norm(w + attn_out)


class PositionwiseFF(nn.Module):
    def __init__(self, d_model: int, d_inner: int):
        super().__init__()
        self.CoreNet = nn.Sequential(nn.Linear(d_model, d_inner), nn.ReLU(), nn.Dropout(0.0),
                                     nn.Linear(d_inner, d_model), nn.Dropout(0.0))
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, inp):
        return self.layer_norm(inp + self.CoreNet(inp))


class RelPartialLearnableDecoderLayer(nn.Module):
    def __init__(self, n_head, d_model, d_head, d_inner):
        super().__init__()
        self.dec_attn = RelPartialLearnableMultiHeadAttn(n_head, d_model, d_head)
        self.pos_ff = PositionwiseFF(d_model, d_inner)

    def forward(self, dec_inp, r, r_w_bias, r_r_bias, mask, mems):
        return self.pos_ff(self.dec_attn(dec_inp, r, r_w_bias, r_r_bias, mask, mems))


class AdaptiveEmbedding(nn.Module):
    """div_val = 1 and d_proj = d_embed: one table, no projection, scaled by sqrt(d_proj)."""

    def __init__(self, n_token: int, d_embed: int):
        super().__init__()
        self.emb_layers = nn.ModuleList([nn.Embedding(n_token, d_embed)])
        self.emb_scale = d_embed ** 0.5

    def forward(self, inp):
        return self.emb_layers[0](inp) * self.emb_scale


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """div_val = 1: one Linear over the whole vocabulary and a cluster head."""

    def __init__(self, n_token: int, d_embed: int, cutoffs: list[int]):
        super().__init__()
        self.cutoffs = cutoffs + [n_token]
        self.cluster_weight = nn.Parameter(torch.zeros(len(cutoffs), d_embed))
        self.cluster_bias = nn.Parameter(torch.zeros(len(cutoffs)))
        self.out_layers = nn.ModuleList([nn.Linear(d_embed, n_token)])

    def probs(self, hidden):
        """Every token's probability: the code's log-probabilities (head_logprob[:, -i] +
        tail_logprob for cluster i), for all tokens at once, exponentiated."""
        W, b = self.out_layers[0].weight, self.out_layers[0].bias
        short = self.cutoffs[0]
        head = F_.log_softmax(hidden @ torch.cat([W[:short], self.cluster_weight]).T
                              + torch.cat([b[:short], self.cluster_bias]), dim=-1)
        parts = [head[..., :short]]
        ends = [0] + self.cutoffs
        for i in range(1, len(ends) - 1):
            lo, hi = ends[i], ends[i + 1]
            tail = F_.log_softmax(hidden @ W[lo:hi].T + b[lo:hi], dim=-1)
            parts.append(head[..., -i, None] + tail)
        return torch.cat(parts, dim=-1).exp()


class MemTransformerLM(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.word_emb = AdaptiveEmbedding(c.V, c.H)
        self.layers = nn.ModuleList(RelPartialLearnableDecoderLayer(c.A, c.H, c.D, c.F)
                                    for _ in range(c.L))
        self.crit = ProjectedAdaptiveLogSoftmax(c.V, c.H, list(c.cutoffs))
        self.crit.out_layers[0].weight = self.word_emb.emb_layers[0].weight  # tie_weight
        self.pos_emb = PositionalEmbedding(c.H)
        self.r_w_bias = nn.Parameter(torch.zeros(c.A, c.D))
        self.r_r_bias = nn.Parameter(torch.zeros(c.A, c.D))

    def segment(self, dec_inp, mems):
        """One segment given the memory (the layers' inputs at the last <= m positions):
        its probabilities and the next memory (_update_mems with ext_len = 0)."""
        qlen, mlen = dec_inp.shape[1], mems[0].shape[1]
        klen = mlen + qlen
        word_emb = self.word_emb(dec_inp)
        dec_attn_mask = torch.triu(torch.ones(qlen, klen, dtype=torch.bool), diagonal=1 + mlen)
        pos_emb = self.pos_emb(torch.arange(klen - 1, -1, -1.0))
        core_out, hids = word_emb, [word_emb]
        for layer, mems_i in zip(self.layers, mems):
            core_out = layer(core_out, pos_emb, self.r_w_bias, self.r_r_bias, dec_attn_mask,
                             mems_i)
            hids.append(core_out)
        end_idx = mlen + qlen
        beg_idx = max(0, end_idx - self.c.m)
        new_mems = [torch.cat([mems[i], hids[i]], 1)[:, beg_idx:end_idx] for i in range(self.c.L)]
        return self.crit.probs(core_out), new_mems

    def run(self, x):
        """The whole sequence, n tokens at a time, from an empty memory."""
        c = self.c
        mems = [torch.zeros(x.shape[0], 0, c.H) for _ in range(c.L)]
        probs = []
        for start in range(0, x.shape[1], c.n):
            p, mems = self.segment(x[:, start:start + c.n], mems)
            probs.append(p)
        return torch.cat(probs, 1), torch.stack(mems, 1)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def setup(request, tmp_path_factory):
    """(config, reference, its checkpoint file, tokens, reference probs and memory)."""
    c = CONFIGS[request.param]
    torch.manual_seed(sum(map(ord, request.param)))
    ref = MemTransformerLM(c).eval()
    peaked_weights(ref, norm_gain="layer_norm.weight")
    folder = tmp_path_factory.mktemp("txl")
    ckpt = folder / "mem_transformer.safetensors"
    safetensors_torch.save_file({k: v.detach().clone().contiguous()
                                 for k, v in ref.state_dict().items()}, str(ckpt))
    x = torch.randint(0, c.V, (c.B, c.total), generator=torch.Generator().manual_seed(c.total))
    with torch.no_grad():
        probs, mem = ref.run(x)
    return c, ref, ckpt, x, probs, mem


def _compile(c: Config, ckpt, target: str, folder):
    compile_spec(str(ROOT / SPEC), str(folder), target, None, c.sets(), weights=str(ckpt))
    return folder


def _torch_module(c: Config, ckpt, folder):
    import importlib.util
    _compile(c, ckpt, "torch", folder)
    spec = importlib.util.spec_from_file_location(f"txl_{folder.name}", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build().eval()
    model.load_state_dict(safetensors_torch.load_file(str(folder / "weights.safetensors")))
    return model


# ---------------------------------------------------------------- segment by segment


def test_reference_is_not_blind(setup):
    """The memory changes the outputs, and the probabilities are peaked: a model that
    ignored the memory, or a wrong graph, could not pass by accident."""
    c, ref, _, x, probs, _ = setup
    assert probs.max().item() > 10.0 / c.V
    second = x[:, c.n:2 * c.n]
    with torch.no_grad():
        alone, _ = ref.segment(second, [torch.zeros(c.B, 0, c.H)] * c.L)
    assert (alone - probs[:, c.n:2 * c.n]).abs().max().item() > 1e-2


def test_torch_segments_match_the_formula(setup, tmp_path):
    c, _, ckpt, x, probs, mem = setup
    model = _torch_module(c, ckpt, tmp_path)
    with torch.no_grad():
        out, state = run_segments(model, {"x": x})
    assert out["probs"].shape == (c.B, c.total, c.V)
    assert state["Mem"].shape == (c.B, c.L, min(c.m, c.total), c.H)
    diff = (out["probs"] - probs).abs().max().item()
    assert diff <= TOL, f"probabilities differ by {diff:.2e}"
    diff = (state["Mem"] - mem).abs().max().item()
    assert diff <= TOL, f"memory differs by {diff:.2e}"


def test_onnx_segments_match_the_formula(setup, tmp_path):
    c, _, ckpt, x, probs, mem = setup
    model = load_onnx(_compile(c, ckpt, "onnx", tmp_path), provider="cpu", cache=False)
    assert model.state == {"Mem'": "Mem"}
    out, state = run_segments(model, {"x": x.numpy()})
    assert out["probs"].shape == (c.B, c.total, c.V)
    diff = float(np.abs(out["probs"] - probs.numpy()).max())
    assert diff <= TOL, f"probabilities differ by {diff:.2e}"
    diff = float(np.abs(state["Mem"] - mem.numpy()).max())
    assert diff <= TOL, f"memory differs by {diff:.2e}"


def test_one_call_takes_and_returns_the_memory(setup, tmp_path):
    """Without the runtime: the first call gets a memory with no rows; each call returns
    each layer's last min(m, p + n) inputs, which the next call takes."""
    c, ref, ckpt, x, _, _ = setup
    model = _torch_module(c, ckpt, tmp_path)
    mem = torch.zeros(c.B, c.L, 0, c.H)
    mems = [torch.zeros(c.B, 0, c.H)] * c.L
    with torch.no_grad():
        for start in range(0, 2 * c.n + 1, c.n):
            seg = x[:, start:start + c.n]
            p, mem = model(seg, mem)
            want, mems = ref.segment(seg, mems)
            assert mem.shape[2] == min(c.m, start + seg.shape[1])
            assert (p - want).abs().max().item() <= TOL
            assert (mem - torch.stack(mems, 1)).abs().max().item() <= TOL


def test_the_graph_declares_its_state(tmp_path):
    """The ONNX graph: `Mem` and `Mem'` with a run-time memory axis, named in the metadata."""
    import onnx
    compile_spec(str(ROOT / SPEC), str(tmp_path), "onnx", None, CONFIGS["L2-A2-n4-m6"].sets())
    g = onnx.load(str(tmp_path / "model.onnx"))

    def dims(v):
        return [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
    assert {i.name: dims(i) for i in g.graph.input} == {"x": ["batch", "T_n"],
                                                         "Mem": ["batch", 2, "T_p", 16]}
    assert {o.name: dims(o) for o in g.graph.output} == {
        "probs": ["batch", "T_n", 23], "Mem'": ["batch", 2, "min(6, T_n + T_p)", 16]}
    meta = {p.key: p.value for p in g.metadata_props}
    sig = json.loads(meta["fgc.signature"])
    assert sig["state"] == {"Mem'": "Mem"}
    assert sig["max_length"] == {"T_n": 4, "T_p": 6}


# ---------------------------------------------------------------- the parameter count


def original_count(L, H, A, D, F, V, cutoffs, div_val=1, d_embed=None) -> int:
    """MemTransformerLM's parameters (attn_type 0, tie_weight, train.py's tie_projs for
    WikiText-103), module by module as mem_transformer.py and proj_adaptive_softmax.py
    build them; tied tensors once."""
    d_embed = d_embed or H
    ends = [0] + list(cutoffs) + [V]
    clusters = len(cutoffs)
    widths = [d_embed // div_val ** i for i in range(clusters + 1)]
    if div_val == 1:
        word_emb = V * d_embed + (H * d_embed if H != d_embed else 0)  # emb_layers, emb_projs
        # cluster head, one out_layers bias over V (its weight is word_emb's); out_projs are
        # None when d_proj == d_embed, else tied to emb_projs[0] after the first
        crit = clusters * d_embed + clusters + V + (H * d_embed if H != d_embed else 0)
    else:
        word_emb = sum((ends[i + 1] - ends[i]) * w + H * w for i, w in enumerate(widths))
        # cluster head, each out_layers bias (weights tied), out_projs[0] (tie_projs[0] is
        # False; the others are emb_projs)
        crit = clusters * d_embed + clusters + V + H * widths[0]
    attn = 3 * A * D * H + A * D * H + A * D * H + 2 * H  # qkv_net, r_net, o_net, layer_norm
    ff = H * F + F + F * H + H + 2 * H                    # CoreNet's two Linears, layer_norm
    return word_emb + crit + L * (attn + ff) + 2 * A * D  # r_w_bias, r_r_bias


BASE = dict(L=16, H=410, A=10, D=41, F=2100, V=267735, cutoffs=[20000, 40000, 200000])


def test_base_preset_counts_the_code_s_parameters():
    r = fgc("params", SPEC, "--preset", "base", "--format", "json")
    assert r.returncode == 0, r.stderr
    total = json.loads(r.stdout)["total"]
    assert total == original_count(**BASE) == 151_107_538
    # the same, counted off the reference module built at that size (no memory used)
    c = Config(L=16, H=410, A=10, F=2100, V=267735, n=150, m=150,
               cutoffs=(20000, 40000, 200000), B=1, total=1)
    with torch.device("meta"):
        ref = MemTransformerLM(c)
    assert sum(p.numel() for p in ref.parameters()) == total


def test_other_readings_of_the_151m():
    """What docs/transformer-xl.md says the figure is not: the base model with div_val = 4
    (the large script's setting), and the large script's own configuration."""
    assert original_count(**{**BASE, "div_val": 4}) == 56_373_328
    assert original_count(L=18, H=1024, A=16, D=64, F=4096, V=267735,
                          cutoffs=[20000, 40000, 200000], div_val=4) == 285_170_506


def test_tiny_configuration_counts_match(setup):
    c, ref, *_ = setup
    r = fgc("params", SPEC, *[a for k, v in c.sets().items() for a in ("--set", f"{k}={v}")],
            "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == sum(p.numel() for p in ref.parameters()) == \
        original_count(c.L, c.H, c.A, c.D, c.F, c.V, c.cutoffs)
