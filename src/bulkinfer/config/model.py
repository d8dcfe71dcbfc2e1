"""``[model]``: what model runs over the rows."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .section import Section


class ModelConfig(Section):
    name: str = ""
    """The model: 'minilm' (bundled all-MiniLM-L6-v2), a sentence-transformers directory,
    a joblib/pickle file of an estimator, an .onnx file, an index written by `bulkinfer index` (kNN: top-k
    neighbours per row), or 'module:attr' naming your own adapter."""
    kind: Literal[
        "auto", "text-embedding", "tabular", "onnx", "custom", "knn", "generate", "remote-batch", "image-onnx"
    ] = "auto"
    """Adapter family; 'auto' infers it from the model name (a causal language model directory: generate;
    'nudenet' and 'ocr': the picture models their packages ship); remote-batch: an OpenAI-compatible Batch API
    at model.base_url runs the rows (model.name is body.model); image-onnx: an ONNX vision model whose
    preprocessing and head model.options declare (docs/images.md)."""
    image_column: str = "image"
    """Picture models: the column holding each picture's bytes or its path/URI (an image input's is 'image')."""
    text_column: str | None = None
    """Column holding the text to embed (text models)."""
    feature_columns: list[str] = Field(default_factory=list)
    """Feature columns in model order (tabular models); default: the model's feature_names_in_."""
    max_seq_length: int | None = Field(default=None, ge=1)
    """Truncate texts to this many tokens; default: the model's own max_seq_length."""
    truncate: bool | None = None
    """A text over the model's token limit: true embeds its first tokens; false refuses it (an error row,
    a 400 answer); unset: a table job truncates (and counts the rows in report.json), an OpenAI request
    (Batch file or online) is refused, as the API does."""
    featurize: Literal["morgan", "descriptors"] | None = None
    """Molecules: turn each row's SMILES (model.smiles_column) into the model's features first, with RDKit
    (the science extra), beside inference; for a joblib model or an .onnx one with one 2-D input. morgan: Morgan
    (ECFP) bits (model.morgan_radius, model.morgan_bits); descriptors: the RDKit descriptors model.feature_columns
    names, in order (all of them when none are listed). A SMILES RDKit cannot parse is an error row naming it."""
    smiles_column: str = "smiles"
    """Molecules (model.featurize): the column holding each row's SMILES."""
    morgan_radius: int = Field(default=2, ge=0, le=8)
    """model.featurize = "morgan": the radius (2 is ECFP4)."""
    morgan_bits: int = Field(default=2048, ge=8, le=65536)
    """model.featurize = "morgan": the fingerprint's length (the model's feature count)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of the adapter: a custom adapter's constructor arguments; for .onnx models
    {inputs = {onnx_input = "column"}, outputs = {onnx_output = "column"}}."""
    prompt_template: str | None = None
    """Generation models: the prompt of each row, with {column} placeholders ("Summarise: {text}");
    default: the text column as it is."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Generation models: tokens generated per row at most (finish_reason = length when reached)."""
    stop: list[str] = Field(default_factory=list)
    """Generation models: a completion ends before the first of these strings (finish_reason = stop)."""
    temperature: float = Field(default=0.0, ge=0)
    """Generation models: 0 is greedy; above 0, sampling (each row with its own seed: see seed)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Generation models, sampling: draw from the smallest set of tokens whose probability reaches top_p."""
    seed: int = 0
    """Generation models, sampling: with the prompt, seeds each row's draws (a resumed row regenerates the same)."""
    messages: list[dict[str, str]] = Field(default_factory=list)
    """Generation models: chat messages ({role, content} with {column} placeholders) rendered by the tokenizer's
    chat template, instead of prompt_template."""
    chat_template: str | None = None
    """Generation models: a Jinja chat template replacing the tokenizer's own."""
    json_schema: dict[str, Any] | str | None = None
    """Generation models: every completion is JSON valid against this schema (an object, or a .json file's path):
    constrained decoding."""
    expand_json: bool = False
    """Generation models with json_schema: the JSON's top-level fields also become typed output columns."""
    ignore_eos: bool = False
    """Generation models: always generate max_new_tokens, EOS or not (benchmarks; as vLLM's ignore_eos)."""
    served_name: str | None = None
    """The model's name in OpenAI requests (body.model) and responses; default: the model directory's name."""
    base_url: str | None = None
    """remote-batch: the Batch API's base URL (https://api.openai.com/v1, http://host:port/v1 of a
    `bulkinfer serve --batches` server...)."""
    api_key_env: str = "OPENAI_API_KEY"
    """remote-batch: the environment variable holding the API key (the key itself is never stored)."""
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] = "/v1/chat/completions"
    """remote-batch: what each row's request asks the remote model for."""
    batch_max_requests: int = Field(default=50_000, ge=1)
    """remote-batch: the most requests per batch file (OpenAI's limit); shards are grouped up to it, and cut no
    larger (source.shard_rows is lowered to it when left at its default, refused when set above it)."""
    batch_max_bytes: int = Field(default=200 * 1024 * 1024, ge=1)
    """remote-batch: the largest batch file (OpenAI's limit: 200 MB)."""
    completion_window: str = "24h"
    """remote-batch: the completion_window each batch is created with."""
    poll_s: float = Field(default=10.0, gt=0)
    """remote-batch: seconds between two looks at the batches in flight."""
    cancel_on_stop: bool = False
    """remote-batch: on SIGTERM, cancel the batches in flight (default: leave them running; the rerun
    collects them)."""
    price_per_million_tokens: dict[Literal["input", "output"], float] = Field(default_factory=dict)
    """remote-batch: the provider's price per million input and output tokens ({input = 0.075, output = 0.3}:
    its batch price, discount included); report.json and `bulkinfer costs` book the spend from each answer's
    usage."""
