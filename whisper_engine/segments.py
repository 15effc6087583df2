"""One window's tokens -> segments with times, following Whisper's timestamp-token layout.

In timestamp mode the model writes ``<|t0|> text <|t1|><|t1'|> text <|t2|> ...``: each pair of
consecutive timestamps closes one segment and opens the next. The parser is total: any token
sequence (including ones from engines that do not enforce the timestamp rules) yields
well-formed, non-overlapping segments inside the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from whisper_engine.tokenizer import TIME_PRECISION


@dataclass(frozen=True)
class RawSegment:
    start: float  # seconds from the window's start
    end: float
    tokens: tuple[int, ...]  # text and timestamp tokens, as generated
    text_tokens: tuple[int, ...]  # text tokens only


def split_segments(
    tokens: tuple[int, ...], timestamp_begin: int, window_seconds: float
) -> list[RawSegment]:
    def is_ts(token: int) -> bool:
        return token >= timestamp_begin

    def seconds(token: int) -> float:
        return min((token - timestamp_begin) * TIME_PRECISION, window_seconds)

    # cut after every closing timestamp of a pair, and at the end
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts(tokens[i]) and is_ts(tokens[i + 1])]
    if not cuts or cuts[-1] != len(tokens):
        cuts.append(len(tokens))
    segments: list[RawSegment] = []
    begin = 0
    for cut in cuts:
        piece = tokens[begin:cut]
        begin = cut
        text = tuple(t for t in piece if not is_ts(t))
        if not text:
            continue
        stamps = [seconds(t) for t in piece if is_ts(t)]
        previous_end = segments[-1].end if segments else 0.0
        start = stamps[0] if stamps and is_ts(piece[0]) else previous_end
        # an unclosed last segment runs to the end of the window
        end = stamps[-1] if len(stamps) >= 2 or (stamps and not is_ts(piece[0])) else window_seconds
        start = max(start, previous_end)
        end = min(max(end, start), window_seconds)
        segments.append(RawSegment(start, end, piece, text))
    return segments
