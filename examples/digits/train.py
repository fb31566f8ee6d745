"""Train DigitsNet on sklearn's digits; write weights.pt, digits.onnx and samples.json here."""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from model import DigitsNet  # noqa: E402

EPOCHS = 100
BATCH_SIZE = 64
LR = 1e-3


def main() -> None:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data.astype(np.float32), digits.target.astype(np.int64),
        test_size=0.2, random_state=0,
    )
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)
    xv = torch.from_numpy(x_test)

    net = DigitsNet()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(EPOCHS):
        net.train()
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), BATCH_SIZE):
            idx = perm[i:i + BATCH_SIZE]
            opt.zero_grad()
            loss_fn(net(xt[idx]), yt[idx]).backward()
            opt.step()

    net.eval()
    with torch.no_grad():
        torch_pred = net(xv).argmax(dim=1).numpy()
    acc = float((torch_pred == y_test).mean())
    print(f"test accuracy: {acc:.4f}")
    if acc < 0.95:
        raise SystemExit("accuracy below 0.95")

    torch.save(net.state_dict(), HERE / "weights.pt")

    onnx_path = HERE / "digits.onnx"
    torch.onnx.export(
        net, (torch.zeros(1, 64),), str(onnx_path),
        input_names=["pixels"], output_names=["logits"],
        dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17, dynamo=False,
    )

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ort_pred = sess.run(["logits"], {"pixels": x_test})[0].argmax(axis=1)
    agree = int((ort_pred == torch_pred).sum())
    print(f"onnxruntime/torch argmax agreement: {agree}/{len(x_test)}")
    if agree != len(x_test):
        raise SystemExit("onnxruntime and torch disagree")

    samples = [{"pixels": [float(v) for v in x_test[i]], "label": int(y_test[i])} for i in range(8)]
    (HERE / "samples.json").write_text(json.dumps(samples) + "\n")


if __name__ == "__main__":
    main()
