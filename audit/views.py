from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    return HttpResponse("The audit views are being built.")
