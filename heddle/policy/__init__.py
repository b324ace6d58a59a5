"""heddle's dtype policy: the dtype set, the lattice, op-class rules, scalars, defaults and errors.

See POLICY.md. Everything here is pure metadata except ``enforce`` (a JAX config scope).
"""

from typing import TYPE_CHECKING, Any

from heddle.policy._dtypes import ALIASES as ALIASES
from heddle.policy._dtypes import DTYPES as DTYPES
from heddle.policy._dtypes import dtype as dtype
from heddle.policy._enforce import enforce as enforce
from heddle.policy._errors import PolicyError as PolicyError
from heddle.policy._errors import PrecisionError as PrecisionError
from heddle.policy._errors import PromotionError as PromotionError
from heddle.policy._errors import ScalarRangeError as ScalarRangeError
from heddle.policy._errors import UnknownDTypeError as UnknownDTypeError
from heddle.policy._format import format as format
from heddle.policy._format import format_values as format_values
from heddle.policy._policy import HEDDLE as HEDDLE
from heddle.policy._policy import JAX as JAX
from heddle.policy._policy import Policy as Policy
from heddle.policy._policy import PromotionTable as PromotionTable
from heddle.policy._policy import current as current
from heddle.policy._policy import default_dtypes as default_dtypes
from heddle.policy._policy import use as use
from heddle.policy._precision import Precision as Precision
from heddle.policy._precision import cast_to_compute as cast_to_compute
from heddle.policy._precision import cast_to_output as cast_to_output
from heddle.policy._precision import cast_to_param as cast_to_param
from heddle.policy._rules import OpClass as OpClass
from heddle.policy._rules import acc_dtype as acc_dtype
from heddle.policy._rules import can_lossless_cast as can_lossless_cast
from heddle.policy._rules import grad_dtype as grad_dtype
from heddle.policy._rules import least_upper_float as least_upper_float
from heddle.policy._rules import promote_types as promote_types
from heddle.policy._rules import reduction_dtypes as reduction_dtypes
from heddle.policy._rules import result_dtype as result_dtype
from heddle.policy._scalars import result_type as result_type
from heddle.policy._table import table as table

# The audit lives in ``heddle.programs`` (the layer that reads traced programs), and its public path
# is ``heddle.audit``. These names are the same objects, resolved on first use, so that importing the
# rules layer never imports the layers above it.
if TYPE_CHECKING:
    from heddle.programs._audit import KINDS as AUDIT_KINDS
    from heddle.programs._audit import AuditReport as AuditReport
    from heddle.programs._audit import Finding as Finding
    from heddle.programs._audit import audit as audit

_AUDIT_NAMES = {
    "audit": "audit",
    "AuditReport": "AuditReport",
    "Finding": "Finding",
    "AUDIT_KINDS": "KINDS",
}


def __getattr__(name: str) -> Any:
    if name in _AUDIT_NAMES:
        from heddle.programs import _audit

        value = getattr(_audit, _AUDIT_NAMES[name])
        globals()[name] = value
        return value
    raise AttributeError(f"module 'heddle.policy' has no attribute {name!r}")


__all__ = [
    "ALIASES",
    "AUDIT_KINDS",
    "DTYPES",
    "HEDDLE",
    "JAX",
    "AuditReport",
    "Finding",
    "OpClass",
    "Policy",
    "PolicyError",
    "Precision",
    "PrecisionError",
    "PromotionError",
    "PromotionTable",
    "ScalarRangeError",
    "UnknownDTypeError",
    "acc_dtype",
    "audit",
    "can_lossless_cast",
    "cast_to_compute",
    "cast_to_output",
    "cast_to_param",
    "current",
    "default_dtypes",
    "dtype",
    "enforce",
    "format",
    "format_values",
    "grad_dtype",
    "least_upper_float",
    "promote_types",
    "reduction_dtypes",
    "result_dtype",
    "result_type",
    "table",
    "use",
]
