"""An import stand-in for ray, for trainer_step.py's verl variants on a host without ray.

verl 0.9.1 imports ray when its package loads (verl/protocol.py annotates DataProtoFuture with
ray.ObjectRef and checks isinstance against it); the step the bench times (verl's fused model
forward and its policy loss) never calls ray. ObjectRef is here as a class nothing is an instance
of; any other name raises, so a path that did reach ray would fail loudly, not run on this.
"""


class ObjectRef:
    """No object is one: verl's isinstance checks against it answer False, as with no futures."""


def __getattr__(name):
    raise AttributeError("ray.%s: this is trainer_step.py's import stand-in for ray (tools/bench/standin), "
                         "not ray; install ray to run what needs it" % name)
