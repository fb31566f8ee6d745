"""An app that takes a class from scikit-learn at the top."""

from sklearn.linear_model import LogisticRegression

import ember

app = ember.App("imports-sklearn")


@app.function(min_replicas=1)
def classify(x: float) -> int:
    model = LogisticRegression().fit([[0.0], [1.0], [9.0], [10.0]], [0, 0, 1, 1])
    return int(model.predict([[x]])[0])
