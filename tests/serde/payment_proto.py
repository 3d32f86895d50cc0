"""A Protobuf message class made at test time, as ``protoc`` would generate it:
``htmqctest.Payment {int64 id = 1; string who = 2;}`` built from a
``FileDescriptorProto`` with the protobuf runtime's descriptor pool and message
factory (no ``protoc`` or grpcio-tools needed). ``--protobuf-type
tests.serde.payment_proto:Payment`` names it on the command line."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _build() -> Any:
    proto = descriptor_pb2.FileDescriptorProto(
        name="htmqc_tests/payment.proto", package="htmqctest", syntax="proto3"
    )
    message = proto.message_type.add(name="Payment")
    message.field.add(name="id", number=1, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    message.field.add(name="who", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(proto.name)
    except KeyError:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("htmqctest.Payment"))


#: The generated-style class: ``Payment(id=1, who="a")``.
Payment: Any = _build()
