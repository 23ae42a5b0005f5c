"""Passes: the checked IR in, facts about it out, the IR itself unchanged.

`params.py` counts parameters (exact per preset, and the closed formula); `sharing.py`
compares the tensors two specs declare in common and counts them jointly; `incremental.py`
derives the key/value-cache form of an autoregressive model, or says what prevents it;
`budget.py` estimates what a compile would build and refuses what cannot finish;
`families.py` says which values carry a family axis (one value per member). None of
them imports a backend, torch or onnx.
"""
