#!/usr/bin/env python3
"""A small research workflow on the kernel's LLM: split a topic into
sub-questions, answer each, then synthesise a summary — one THINK per step.

Usage: python agents/research_agent.py [topic ...]
"""

import sys

from agentos import AgentOSClient, AgentOSError
from llm_text import list_items

DEFAULT_TOPIC = "why the sky is blue"
MAX_QUESTIONS = 3


def sub_questions(kernel: AgentOSClient, topic: str) -> list[str]:
    reply = kernel.think(
        f"Write {MAX_QUESTIONS} short questions that would help someone understand "
        f"this topic: {topic}. One question per line, nothing else.",
        max_tokens=96,
        temperature=0.3,
    )
    questions = [q for q in list_items(reply["content"], MAX_QUESTIONS) if q.endswith("?")]
    # The model may answer instead of asking; research still needs questions.
    fallback = [f"What is {topic}?", f"Why does {topic} matter?"]
    for question in fallback:
        if len(questions) >= 2:
            break
        questions.append(question)
    return questions[:MAX_QUESTIONS]


def answer(kernel: AgentOSClient, topic: str, question: str) -> str:
    reply = kernel.think(
        question,
        system=f"You are researching {topic}. Answer in at most two sentences.",
        max_tokens=80,
        temperature=0.3,
    )
    return reply["content"].strip()


def synthesise(kernel: AgentOSClient, topic: str, notes: list[tuple[str, str]]) -> str:
    findings = "\n".join(f"Q: {q}\nA: {a}" for q, a in notes)
    reply = kernel.think(
        f"Here are research notes on {topic}:\n{findings}\n\n"
        f"Write a short summary of {topic} in three sentences.",
        max_tokens=128,
        temperature=0.3,
    )
    return reply["content"].strip()


def main(argv: list[str]) -> int:
    topic = " ".join(argv).strip() or DEFAULT_TOPIC
    with AgentOSClient(timeout=120) as kernel:
        print(f"researching: {topic}", flush=True)
        questions = sub_questions(kernel, topic)
        notes = []
        for i, question in enumerate(questions, 1):
            print(f"\n[{i}/{len(questions)}] {question}", flush=True)
            found = answer(kernel, topic, question)
            print(f"    {found or '(no answer)'}", flush=True)
            notes.append((question, found))
        summary = synthesise(kernel, topic, notes)
    print(f"\nsummary: {summary}", flush=True)
    if not summary:
        print("research_agent: the model returned an empty summary", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AgentOSError as err:
        print(f"research_agent: THINK failed: {err.code} — {err.message}", file=sys.stderr)
        sys.exit(1)
