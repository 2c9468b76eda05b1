"""Tiny MMMU / OCRBench / MME datasets with exactly the Hub features, saved to disk like a user's local copy."""

from __future__ import annotations

from pathlib import Path

COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255)}


def image(color: str, size=(32, 32), mode="RGB"):
    from PIL import Image

    return Image.new("RGB", size, COLORS[color]).convert(mode)


def mmmu_features():
    from datasets import Features, Image, Value

    return Features({
        "id": Value("string"), "question": Value("string"), "options": Value("string"),
        "explanation": Value("string"), **{f"image_{n}": Image() for n in range(1, 8)},
        "img_type": Value("string"), "answer": Value("string"), "topic_difficulty": Value("string"),
        "question_type": Value("string"), "subfield": Value("string"),
    })


MMMU_ROWS = [
    # id, question, options, answer, question_type, images (image_1, image_2, ...)
    ("validation_Accounting_1", "<image 1> What is the price?", "['$6', '$7', '$8']", "B", "multiple-choice", ["red"]),
    ("validation_Math_2", "<image 1> How many degrees?", "[]", "42", "open", ["green"]),
    ("validation_Art_3", "Which painting came first, <image 2> or <image 1>? Compare with <image 3>.",
     "['<image 1>', '<image 2>']", "A", "multiple-choice", ["red", "green", "blue"]),
    ("dev_Physics_1", "<image 1> Which force?", "['gravity', 'friction', 'tension', 'normal']", "C",
     "multiple-choice", ["white"]),
    ("test_Physics_9", "<image 1> Held-out test question.", "['a', 'b']", "", "multiple-choice", ["white"]),
]


def mmmu_dataset():
    from datasets import Dataset

    rows = []
    for sample_id, question, options, answer, qtype, colors in MMMU_ROWS:
        row = {"id": sample_id, "question": question, "options": options, "explanation": "", "img_type": "['Photos']",
               "answer": answer, "topic_difficulty": "Easy", "question_type": qtype, "subfield": "x"}
        # Palette and RGBA images, as MMMU has: the requests must still carry RGB images.
        modes = ["P", "RGBA", "RGB"]
        for n in range(1, 8):
            row[f"image_{n}"] = image(colors[n - 1], mode=modes[(n - 1) % 3]) if n <= len(colors) else None
        rows.append(row)
    return Dataset.from_list(rows, features=mmmu_features())


def ocrbench_features():
    from datasets import Features, Image, Sequence, Value

    return Features({"dataset": Value("string"), "question": Value("string"), "question_type": Value("string"),
                     "answer": Sequence(Value("string")), "image": Image()})


OCRBENCH_ROWS = [
    ("IIIT5K", "what is written in the image?", "Regular Text Recognition", ["Hello"]),
    ("HME100k", "Please write out the expression of the formula in the image using LaTeX format.",
     "Handwritten Mathematical Expression Recognition", ["\\frac { a } { b }"]),
    ("docVQA", "What is the date?", "Doc-oriented VQA", ["March 3", "3 March"]),
]


def ocrbench_dataset():
    from datasets import Dataset

    rows = [{"dataset": d, "question": q, "question_type": t, "answer": a, "image": image("white")}
            for d, q, t, a in OCRBENCH_ROWS]
    return Dataset.from_list(rows, features=ocrbench_features())


def mme_features():
    from datasets import Features, Image, Value

    return Features({"question_id": Value("string"), "image": Image(), "question": Value("string"),
                     "answer": Value("string"), "category": Value("string")})


MME_ROWS = [  # two questions per image, one Yes and one No, sharing the question_id
    ("existence/000000006040.jpg", "Is there a train in this image? Please answer yes or no.", "Yes", "existence"),
    ("existence/000000006040.jpg", "Is there a bed in this image? Please answer yes or no.", "No", "existence"),
    ("code_reasoning/0020.png", "Is a python code shown in the picture? Please answer yes or no.", "Yes",
     "code_reasoning"),
    ("code_reasoning/0020.png", "Is a c++ code shown in the picture? Please answer yes or no.", "No", "code_reasoning"),
]


def mme_dataset():
    from datasets import Dataset

    rows = [{"question_id": q, "image": image("blue"), "question": text, "answer": a, "category": c}
            for q, text, a, c in MME_ROWS]
    return Dataset.from_list(rows, features=mme_features())


BUILDERS = {"mmmu": mmmu_dataset, "ocrbench": ocrbench_dataset, "mme": mme_dataset}


def save(benchmark: str, directory) -> Path:
    """The benchmark's fixture written with `save_to_disk`, as a user's offline copy."""
    directory = Path(directory)
    BUILDERS[benchmark]().save_to_disk(str(directory))
    return directory
