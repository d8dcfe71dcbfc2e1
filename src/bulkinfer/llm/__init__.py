"""Language-model generation and the OpenAI API's shapes: the batched decoding loop
(``decode``), constrained JSON decoding (``constrain``), prompts and chat templates
(``prompts``), the API's request and response bodies (``openai_api``) and Batch API output
files (``batch_files``)."""
