"""A scheduler's template that reached the job unrendered (``{{ ds }}`` in a path) is refused in one
line naming the setting, before anything is written; a prompt's or chat template's own braces are not."""

from __future__ import annotations

import pytest

from bulkinfer import ConfigError, load_config, run_job

BASE = {"source.paths": ["in.parquet"], "model.name": "minilm", "model.text_column": "t", "sink.path": "out"}


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("sink.path", "s3://embeddings/catalog/{{ ds }}", "sink.path = 's3://embeddings/catalog/{{ ds }}'"),
        ("source.paths", ["s3://catalog/{{ ds }}/*.parquet"], "source.paths[0] = "),
        ("cost.labels", {"night": "{{ ds_nodash }}"}, "cost.labels.night = "),
        ("sink.storage_options", {"secret": "{{ var.value.s3_secret }}"}, "sink.storage_options.secret: holds"),
    ],
)
def test_an_unrendered_template_is_refused_naming_the_setting(tmp_path, monkeypatch, setting, value, said):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(overrides={**BASE, setting: value})
    with pytest.raises(ConfigError) as err:
        run_job(cfg)
    message = str(err.value)
    assert message.startswith(said) and "the scheduler did not render" in message and "\n" not in message
    assert "var.value" not in message  # a credential's value is not repeated
    assert not (tmp_path / "out").exists()


def test_templates_of_their_own_are_not_taken_for_a_schedulers():
    own = {"model.prompt_template": "Say {{literally}} {t}",
           "model.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
           "model.messages": [{"role": "user", "content": "{{ x }} {t}"}]}  # fmt: skip
    with pytest.raises(ConfigError) as err:  # with a path left unrendered too: the path is what is named
        load_config(overrides={**BASE, **own, "sink.path": "out/{{ ds }}"}).refuse_unrendered()
    assert str(err.value).startswith("sink.path = 'out/{{ ds }}'")
    assert load_config(overrides={**BASE, **own}).model.chat_template == own["model.chat_template"]
