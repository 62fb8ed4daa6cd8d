from channels.generic.websocket import AsyncWebsocketConsumer


class ApprovalQueueConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.close()
