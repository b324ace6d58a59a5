import heddle.nn as nn
import heddle.numpy as jnp


def mlp(params, x):
    for w, b in params[:-1]:
        x = nn.relu(jnp.matmul(x, w) + b)
    w, b = params[-1]
    return jnp.matmul(x, w) + b


def loss(params, x, labels):
    logp = nn.log_softmax(mlp(params, x))
    return -jnp.mean(jnp.sum(logp * labels, axis=-1))
