from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse


@login_required
def queue(request: HttpRequest) -> HttpResponse:
    return HttpResponse("The approvals dashboard is being built; decide calls in /admin/ for now.")
