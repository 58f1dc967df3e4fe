"""SGLang programs, run by SGLang's own frontend (``sglang.lang``, in a separate venv) against
a radixserve server: ``python programs.py URL [regex]``. Prints one JSON object of results.
Written against SGLang's documented frontend API; nothing in it knows radixserve."""

import json
import sys

import sglang as sgl


@sgl.function
def multi_turn(s, q1, q2):
    s += sgl.system("You are terse.")
    s += sgl.user(q1)
    s += sgl.assistant(sgl.gen("a1", max_tokens=8, temperature=0))
    s += sgl.user(q2)
    s += sgl.assistant(sgl.gen("a2", max_tokens=8, temperature=0))


@sgl.function
def pick(s, question):
    s += question + " The answer is " + sgl.select("ans", choices=["yes", "no", "maybe"])


@sgl.function
def forked(s):
    s += "Two tips.\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Tip {i}:" + sgl.gen("tip", max_tokens=6, temperature=0)
    forks.join()
    s += "Tip 0 was" + forks[0]["tip"] + " and tip 1 was" + forks[1]["tip"]


@sgl.function
def constrained(s):
    s += "Answer: " + sgl.gen("answer", regex=r"(yes|no), [a-z]{2,6}", max_tokens=24)


def main():
    url = sys.argv[1]
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    out = {}
    args = [{"q1": "hello", "q2": "bye"}, {"q1": "name a prime", "q2": "another"}]
    states = multi_turn.run_batch(args, num_threads=2)
    out["batch"] = [{"text": st.text(), "a1": st["a1"], "a2": st["a2"]} for st in states]
    out["select"] = [pick.run(question=q)["ans"] for q in ("Is 7 prime?", "Is 8 prime?")]
    st = forked.run()
    out["fork"] = {"text": st.text()}
    whole = multi_turn.run(q1="hello", q2="bye")
    streamed = multi_turn.run(q1="hello", q2="bye", stream=True)
    out["stream"] = {"whole": whole.text(), "pieces": list(streamed.text_iter())}
    if "regex" in sys.argv[2:]:
        out["regex"] = [constrained.run()["answer"] for _ in range(3)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
