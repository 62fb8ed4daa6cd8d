from typing import Any

from cryptography.hazmat.primitives import serialization
from django.core.management.base import BaseCommand
from py_vapid import Vapid, b64urlencode


class Command(BaseCommand):
    help = "Print a new VAPID key pair for Web Push (HARNESS_VAPID_PUBLIC_KEY / _PRIVATE_KEY)."

    def handle(self, *args: Any, **options: Any) -> None:
        vapid = Vapid()
        vapid.generate_keys()
        private = vapid.private_key.private_numbers().private_value.to_bytes(32, "big")
        public = vapid.public_key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        self.stdout.write(f"HARNESS_VAPID_PUBLIC_KEY={b64urlencode(public)}")
        self.stdout.write(f"HARNESS_VAPID_PRIVATE_KEY={b64urlencode(private)}")
