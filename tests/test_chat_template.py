"""chat_templates/whisper.jinja rendered the way trtllm-serve renders a chat template
(transformers' apply_chat_template: a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, ``raise_exception``, the messages and add_generation_prompt=True)."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers.utils.chat_template_utils import render_jinja_template

from whisper_engine.checkpoints import resolve_checkpoint
from whisper_engine.languages import LANGUAGES
from whisper_engine.tokenizer import WhisperTokenizer

TEMPLATE = (Path(__file__).resolve().parent.parent / "chat_templates/whisper.jinja").read_text()
AUDIO_PARTS = [
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
]


def render_like_transformers(messages: list[dict]) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=TEMPLATE, add_generation_prompt=True
    )
    return rendered[0]


def render_plain_sandbox(messages: list[dict]) -> str:
    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(TEMPLATE).render(messages=messages, add_generation_prompt=True)


RENDERERS = [render_like_transformers, render_plain_sandbox]


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


@pytest.mark.parametrize("render", RENDERERS)
@pytest.mark.parametrize("audio", AUDIO_PARTS, ids=lambda p: p["type"])
def test_default_is_english_transcription_without_timestamps(render, audio):
    assert render(_user(audio)) == "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


@pytest.mark.parametrize("render", RENDERERS)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("language=de", "<|startoftranscript|><|de|><|transcribe|><|notimestamps|>"),
        ("task=translate", "<|startoftranscript|><|en|><|translate|><|notimestamps|>"),
        (
            "Please: language=de task=translate",
            "<|startoftranscript|><|de|><|translate|><|notimestamps|>",
        ),
        ("language=ja timestamps=true", "<|startoftranscript|><|ja|><|transcribe|>"),
        ("LANGUAGE=FR", "<|startoftranscript|><|fr|><|transcribe|><|notimestamps|>"),
        ("transcribe this, thanks", "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"),
    ],
)
def test_text_hints_choose_language_task_and_timestamps(render, text, expected):
    messages = [
        {"role": "system", "content": "language=zh is ignored outside user messages"},
        *_user(AUDIO_PARTS[0], {"type": "text", "text": text}),
    ]
    assert render(messages) == expected


@pytest.mark.parametrize("render", RENDERERS)
def test_content_flattened_to_a_string_works_too(render):
    messages = [{"role": "user", "content": "language=es"}]
    assert render(messages) == "<|startoftranscript|><|es|><|transcribe|><|notimestamps|>"


@pytest.mark.parametrize("render", RENDERERS)
@pytest.mark.parametrize("text", ["language=xx", "task=summarize"])
def test_bad_hints_raise(render, text):
    with pytest.raises(jinja2.exceptions.TemplateError):
        render(_user(AUDIO_PARTS[0], {"type": "text", "text": text}))


def test_template_knows_every_language_of_the_engine():
    for code in LANGUAGES:
        rendered = render_plain_sandbox([{"role": "user", "content": f"language={code}"}])
        assert rendered.startswith(f"<|startoftranscript|><|{code}|>")


def test_rendered_prompt_tokenizes_to_whisper_special_tokens():
    tokenizer = WhisperTokenizer.from_file(resolve_checkpoint() / "tokenizer.json")
    rendered = render_like_transformers(
        _user(AUDIO_PARTS[1], {"type": "text", "text": "language=de task=translate"})
    )
    expected = tokenizer.decoder_prompt("de", "translate", timestamps=False)
    assert tuple(tokenizer.encode(rendered)) == expected
    assert expected[0] == tokenizer.special.sot
